"""Sending a pre-rendered notification email (no templating, no queueing: the caller renders, it is sent
at once)."""

from __future__ import annotations

import html
import re
import uuid
from email.message import EmailMessage

from flask import current_app

from app.email.senders import EmailSender, SendResult
from app.registry import find_service
from app.tenancy import Tenant

_HTML_HINT = re.compile(r"<\s*(html|body|p|div|br|table|a|span|h[1-6]|ul|ol|strong|em)\b", re.I)
_TAGS = re.compile(r"<[^>]+>")


def get_sender() -> EmailSender:
    """The app's sender (service `email_sender`, app.registry)."""
    return find_service("email_sender")


def looks_like_html(body: str) -> bool:
    return bool(_HTML_HINT.search(body))


def html_to_text(body: str) -> str:
    """A readable plain-text alternative for HTML bodies (clients without HTML, spam filters)."""
    text = re.sub(r"<\s*(br|/p|/div|/h[1-6]|/li|/tr)\s*/?>", "\n", body, flags=re.I)
    text = html.unescape(_TAGS.sub("", text))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def build_message(sender_address: str, to: list[str], subject: str, body: str, tenant: Tenant) -> EmailMessage:
    """The message, its Message-ID and (HTML with a text alternative) its MIME boundary drawn from uuid4
    (the OS's randomness): the email package's own `make_msgid` and boundary draw from the `random`
    module's shared generator, which bulk sends would advance from their delivery threads."""
    message = EmailMessage()
    message["From"] = sender_address
    message["To"] = ", ".join(to)
    message["Subject"] = subject
    message["Message-ID"] = f"<{uuid.uuid4().hex}@platform-gateway>"
    message["X-Org-ID"] = tenant.org_id
    if looks_like_html(body):
        message.set_content(html_to_text(body))
        message.add_alternative(body, subtype="html")
        message.set_boundary(f"=_{uuid.uuid4().hex}")
    else:
        message.set_content(body)
    return message


def unique_addresses(addresses: list[str]) -> list[str]:
    """The one recipient normalisation of /email/send and bulk send: trimmed, the first spelling kept,
    later duplicates dropped comparing case-insensitively (`Ann@X.com` and ` ann@x.com` are one
    recipient: one message, not two)."""
    seen: set[str] = set()
    out = []
    for address in addresses:
        address = address.strip()
        if address.lower() not in seen:
            seen.add(address.lower())
            out.append(address)
    return out


def send_email(to: list[str], subject: str, body: str, tenant: Tenant) -> SendResult:
    """Build and deliver one message; delivery problems come back as `success: false`."""
    unique_to = unique_addresses(to)
    message = build_message(current_app.config["EMAIL_FROM"], unique_to, subject, body, tenant)
    return get_sender().send(message)
