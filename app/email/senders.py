"""Email senders behind one interface, chosen by EMAIL_BACKEND (console | smtp)."""

from __future__ import annotations

import logging
import os
import smtplib
import ssl
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage

log = logging.getLogger(__name__)


@dataclass
class SendResult:
    success: bool
    message: str
    refused: tuple[str, ...] = ()


class EmailSender(ABC):
    @abstractmethod
    def send(self, message: EmailMessage) -> SendResult:
        """Deliver `message`; never raises for delivery problems (they are reported in the result)."""


class ConsoleEmailSender(EmailSender):
    """Development backend: each message is written to VAR_DIR/outbox/*.eml and logged."""

    def __init__(self, outbox: str) -> None:
        self.outbox = outbox

    def send(self, message: EmailMessage) -> SendResult:
        os.makedirs(self.outbox, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        path = os.path.join(self.outbox, f"{stamp}-{uuid.uuid4().hex[:8]}.eml")
        with open(path, "wb") as fh:
            fh.write(bytes(message))
        log.info("email to %s, subject %r written to %s", message["To"], message["Subject"], path)
        return SendResult(True, f"Written to outbox ({os.path.basename(path)}).")


class SmtpEmailSender(EmailSender):
    """A real SMTP conversation: connect, EHLO, STARTTLS (optional), AUTH (optional), send."""

    def __init__(self, host: str, port: int, username: str = "", password: str = "",
                 starttls: bool = True, timeout: float = 15.0) -> None:
        self.host, self.port, self.username, self.password = host, port, username, password
        self.starttls, self.timeout = starttls, timeout

    def send(self, message: EmailMessage) -> SendResult:
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
                smtp.ehlo()
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                    smtp.ehlo()
                if self.username:
                    smtp.login(self.username, self.password)
                refused = smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            return SendResult(False, f"All recipients were refused: {', '.join(sorted(exc.recipients))}.",
                              tuple(sorted(exc.recipients)))
        except smtplib.SMTPAuthenticationError:
            return SendResult(False, "SMTP authentication failed.")
        except smtplib.SMTPResponseException as exc:
            return SendResult(False, f"SMTP server answered {exc.smtp_code}: {_text(exc.smtp_error)}")
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            log.warning("SMTP delivery to %s:%s failed: %s", self.host, self.port, exc)
            return SendResult(False, f"SMTP server unavailable: {type(exc).__name__}.")
        if refused:
            return SendResult(True, f"Sent; refused recipients: {', '.join(sorted(refused))}.",
                              tuple(sorted(refused)))
        return SendResult(True, "Sent.")


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def build_sender(config) -> EmailSender:
    backend = config["EMAIL_BACKEND"]
    if backend == "console":
        return ConsoleEmailSender(os.path.join(config["VAR_DIR"], "outbox"))
    if backend == "smtp":
        return SmtpEmailSender(config["SMTP_HOST"], config["SMTP_PORT"], config["SMTP_USERNAME"],
                               config["SMTP_PASSWORD"], config["SMTP_STARTTLS"])
    raise RuntimeError(f"unknown EMAIL_BACKEND {backend!r} (use console or smtp)")
