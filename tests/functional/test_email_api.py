"""Email through HTTP: validation, scopes, the console outbox, and a real SMTP conversation."""

from __future__ import annotations

import email
import glob
import os
import socket

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

SEND = "/api/v1/email/send"
GOOD = {"to": ["ann@example.com"], "subject": "Welcome", "body": "<p>Hello <b>Ann</b></p>"}


class RecordingHandler:
    def __init__(self):
        self.messages = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refuse"):
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content,
                              getattr(session, "auth_data", None)))
        return "250 Message accepted"


def _authenticator(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, LoginPassword) and auth_data.login == b"mailer" and auth_data.password == b"s3cret"
    return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)


@pytest.fixture()
def smtp_server():
    handler = RecordingHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port(), authenticator=_authenticator,
                            auth_require_tls=False, auth_required=False)
    controller.start()
    yield handler, controller.port
    controller.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("body,field", [
    ({"to": [], "subject": "s", "body": "b"}, "to"),
    ({"to": ["not-an-address"], "subject": "s", "body": "b"}, "to"),
    ({"to": ["a@example.com"], "subject": "two\r\nBcc: victim@example.com", "body": "b"}, "subject"),
    ({"to": ["a@example.com"], "subject": "", "body": "b"}, "subject"),
    ({"to": ["a@example.com"], "subject": "s"}, "body"),
    ({"to": ["a@example.com"] * 51, "subject": "s", "body": "b"}, "to"),
    ({"to": ["a@example.com"], "subject": "s", "body": "b", "cc": ["x@example.com"]}, "cc"),
])
def test_invalid_requests_are_400_naming_the_field(client, auth, body, field):
    resp = client.post(SEND, json=body, headers=auth("write:notifications"))
    assert resp.status_code == 400
    payload = resp.get_json()
    assert payload["error"]["code"] == "VALIDATION_ERROR"
    assert field in payload["error"]["details"]["fields"]


@pytest.mark.parametrize("scopes,status", [(("read",), 403), (("write:agents",), 403),
                                           (("write:notifications",), 200), (("write",), 200)])
def test_scope_write_notifications(client, auth, scopes, status):
    assert client.post(SEND, json=GOOD, headers=auth(*scopes)).status_code == status


def test_console_backend_writes_the_message_to_the_outbox(client, auth, app, org_id):
    outbox = os.path.join(app.config["VAR_DIR"], "outbox")
    before = set(glob.glob(os.path.join(outbox, "*.eml")))
    resp = client.post(SEND, json=GOOD, headers=auth("write:notifications"))
    assert resp.status_code == 200 and resp.get_json()["success"] is True
    (path,) = set(glob.glob(os.path.join(outbox, "*.eml"))) - before
    message = email.message_from_bytes(open(path, "rb").read())
    assert message["To"] == "ann@example.com" and message["Subject"] == "Welcome"
    assert message["X-Org-ID"] == org_id
    parts = {p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk()
             if not p.is_multipart()}
    assert parts["text/html"].strip() == GOOD["body"]
    assert parts["text/plain"].strip() == "Hello Ann"


def test_smtp_backend_real_conversation_with_auth(make_app, smtp_server, make_token):
    handler, port = smtp_server
    app = make_app(EMAIL_BACKEND="smtp", SMTP_HOST="127.0.0.1", SMTP_PORT=port, SMTP_STARTTLS=False,
                   SMTP_USERNAME="mailer", SMTP_PASSWORD="s3cret", EMAIL_FROM="Gateway <gw@example.com>")
    headers = {"Authorization": f"Bearer {make_token(scopes=['write:notifications'])}"}
    body = {"to": ["ann@example.com", "bob@example.com", "ann@example.com"], "subject": "Plain",
            "body": "Just text."}
    resp = app.test_client().post(SEND, json=body, headers=headers)
    assert resp.get_json() == {"success": True, "message": "Sent."}
    (mail_from, rcpts, content, auth_data), = handler.messages
    assert mail_from == "gw@example.com" and rcpts == ["ann@example.com", "bob@example.com"]
    assert auth_data.login == b"mailer"
    message = email.message_from_bytes(content)
    assert message["Subject"] == "Plain" and message.get_content_type() == "text/plain"


def test_send_and_bulk_dedupe_recipients_alike(make_app, smtp_server, make_token):
    """/email/send and bulk send share one normalisation (app.email.services.unique_addresses): the
    same address in another case is one recipient, the first spelling kept, on both paths."""
    from app.email.bulk import unique_addresses as bulk_unique
    from app.email.services import unique_addresses

    assert bulk_unique is unique_addresses
    handler, port = smtp_server
    app = make_app(EMAIL_BACKEND="smtp", SMTP_HOST="127.0.0.1", SMTP_PORT=port, SMTP_STARTTLS=False,
                   EMAIL_FROM="Gateway <gw@example.com>", REDIS_URL="")
    headers = {"Authorization": f"Bearer {make_token(scopes=['write:notifications'])}"}
    to = ["Ann@Example.com", "bob@example.com", "ann@example.com", "BOB@EXAMPLE.COM"]
    resp = app.test_client().post(SEND, json={"to": to, "subject": "s", "body": "b"}, headers=headers)
    assert resp.get_json()["success"] is True
    (_from, rcpts, _content, _auth), = handler.messages
    assert rcpts == ["Ann@Example.com", "bob@example.com"]
    handler.messages.clear()
    resp = app.test_client().post("/api/v1/email/bulk-send", json={"recipients": to, "subject": "s", "body": "b"},
                                  headers=headers)
    assert resp.status_code == 202 and resp.get_json()["total"] == 2
    assert sorted(r for _f, rcpt, _c, _a in handler.messages for r in rcpt) == ["Ann@Example.com",
                                                                                 "bob@example.com"]


def test_smtp_wrong_password_is_success_false(make_app, smtp_server, make_token):
    _handler, port = smtp_server
    app = make_app(EMAIL_BACKEND="smtp", SMTP_HOST="127.0.0.1", SMTP_PORT=port, SMTP_STARTTLS=False,
                   SMTP_USERNAME="mailer", SMTP_PASSWORD="wrong")
    resp = app.test_client().post(SEND, json=GOOD, headers={
        "Authorization": f"Bearer {make_token(scopes=['write:notifications'])}"})
    assert resp.status_code == 200
    assert resp.get_json() == {"success": False, "message": "SMTP authentication failed."}


def test_smtp_refused_recipients_are_reported(make_app, smtp_server, make_token):
    handler, port = smtp_server
    app = make_app(EMAIL_BACKEND="smtp", SMTP_HOST="127.0.0.1", SMTP_PORT=port, SMTP_STARTTLS=False)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {make_token(scopes=['write:notifications'])}"}
    partial = client.post(SEND, json=GOOD | {"to": ["ok@example.com", "refuse@example.com"]}, headers=headers)
    assert partial.get_json() == {"success": True, "message": "Sent; refused recipients: refuse@example.com."}
    allbad = client.post(SEND, json=GOOD | {"to": ["refuse@example.com"]}, headers=headers)
    assert allbad.get_json()["success"] is False and "refuse@example.com" in allbad.get_json()["message"]
    assert len(handler.messages) == 1


def test_smtp_server_down_answers_quickly_with_success_false(make_app, make_token):
    app = make_app(EMAIL_BACKEND="smtp", SMTP_HOST="127.0.0.1", SMTP_PORT=_free_port(), SMTP_STARTTLS=False)
    resp = app.test_client().post(SEND, json=GOOD, headers={
        "Authorization": f"Bearer {make_token(scopes=['write:notifications'])}"})
    assert resp.status_code == 200
    assert resp.get_json() == {"success": False, "message": "SMTP server unavailable: ConnectionRefusedError."}


def test_authorization_is_checked_before_body_validation(client, auth):
    """A token without the scope learns nothing from validation: 403, not 400."""
    resp = client.post(SEND, json={"to": "nonsense"}, headers=auth("read"))
    assert resp.status_code == 403 and resp.get_json()["error"]["code"] == "FORBIDDEN"
