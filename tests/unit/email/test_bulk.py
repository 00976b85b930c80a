"""Bulk email logic: address de-duplication, the signed unsubscribe token, SMTP answer classification."""

from __future__ import annotations

import smtplib

import pytest
from flask import Flask

from app.email.newsletter import read_token, unsubscribe_token
from app.email.senders import SmtpBatchTransport, SmtpEmailSender
from app.email.services import unique_addresses
from app.errors import Unauthorized


def test_unique_addresses_keeps_first_spelling_and_order():
    assert unique_addresses([" Ann@x.com", "bob@x.com", "ann@X.com", "bob@x.com "]) == ["Ann@x.com", "bob@x.com"]
    assert unique_addresses([]) == []
    assert unique_addresses(["straße@x.com", "STRASSE@x.com"]) == ["straße@x.com", "STRASSE@x.com"]


@pytest.fixture()
def ctx():
    app = Flask(__name__)
    app.config["JWT_SECRET"] = "s" * 40
    with app.app_context():
        yield app


def test_token_round_trip_and_tampering(ctx):
    tok = unsubscribe_token("default", "acme.com", "sub-1")
    assert read_token(tok) == ("default", "acme.com", "sub-1")
    payload, sig = tok.split(".")
    other = unsubscribe_token("default", "evil.com", "sub-1").split(".")[0]
    for bad in (f"{other}.{sig}", f"{payload}.{sig[::-1]}", payload, f"{payload}.", "..", "%%.%%"):
        with pytest.raises(Unauthorized):
            read_token(bad)
    ctx.config["JWT_SECRET"] = "t" * 40  # another deployment's secret: not valid here
    with pytest.raises(Unauthorized):
        read_token(tok)


class FakeSmtp:
    def __init__(self, exc=None, refused=None):
        self.exc, self.refused, self.closed, self.reset = exc, refused or {}, False, False

    def send_message(self, message):
        if self.exc:
            raise self.exc
        return self.refused

    def rset(self):
        self.reset = True

    def quit(self):
        self.closed = True

    def close(self):
        self.closed = True


@pytest.mark.parametrize("exc,status,code,keeps_connection", [
    (smtplib.SMTPRecipientsRefused({"a@x": (550, b"no such user")}), "failed", 550, True),
    (smtplib.SMTPRecipientsRefused({"a@x": (451, b"later")}), "retry", 451, True),
    (smtplib.SMTPDataError(554, b"spam"), "failed", 554, True),
    (smtplib.SMTPDataError(452, b"full"), "retry", 452, True),
    (smtplib.SMTPResponseException(421, b"closing"), "retry", 421, False),
    (smtplib.SMTPServerDisconnected("gone"), "retry", None, False),
    (TimeoutError(), "retry", None, False),
    (smtplib.SMTPAuthenticationError(535, b"bad"), "failed", 535, False),
])
def test_smtp_answers_are_classified(exc, status, code, keeps_connection):
    transport = SmtpBatchTransport(SmtpEmailSender("127.0.0.1", 1))
    transport.smtp = fake = FakeSmtp(exc)
    result = transport.deliver(object())
    assert (result.status, result.code) == (status, code)
    assert (transport.smtp is fake) == keeps_connection


def test_sent_and_partially_refused():
    transport = SmtpBatchTransport(SmtpEmailSender("127.0.0.1", 1))
    transport.smtp = FakeSmtp()
    assert transport.deliver(object()).status == "sent"
    transport.smtp = FakeSmtp(refused={"a@x": (550, b"no")})
    assert transport.deliver(object()).status == "failed"


def _smtp_server_that_drops(after: bytes):
    """A loopback SMTP server (one connection) that speaks plainly until it has read `after`, then closes
    without answering: `b"DATA"` drops when the DATA command arrives, `b"\\r\\n.\\r\\n"` once the whole
    message was sent (the server may have queued it)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"220 test ESMTP\r\n")
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
                if after in data.upper():
                    return  # gone without a word
                while b"\r\n" in data:
                    line, data = data.split(b"\r\n", 1)
                    verb = line[:4].upper()
                    if verb == b"EHLO":
                        conn.sendall(b"250 test\r\n")
                    elif verb == b"DATA":
                        conn.sendall(b"354 go ahead\r\n")
                        break
                    else:
                        conn.sendall(b"250 ok\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return listener


def _message():
    from email.message import EmailMessage

    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "a@example.com", "b@example.com", "hello"
    message.set_content("body")
    return message


def test_a_connection_lost_during_data_is_not_retried():
    """Once the message went to the server, a dropped connection may hide a delivery: `failed`, never
    `retry` (a retry could deliver it twice)."""
    listener = _smtp_server_that_drops(b"\r\n.\r\n")
    with listener:
        sender = SmtpEmailSender("127.0.0.1", listener.getsockname()[1], starttls=False, timeout=5)
        transport = SmtpBatchTransport(sender)
        result = transport.deliver(_message())
    assert result.status == "failed" and "may have been delivered" in result.message, result


def test_a_connection_lost_before_data_is_retried():
    listener = _smtp_server_that_drops(b"RCPT")
    with listener:
        sender = SmtpEmailSender("127.0.0.1", listener.getsockname()[1], starttls=False, timeout=5)
        transport = SmtpBatchTransport(sender)
        result = transport.deliver(_message())
    assert result.status == "retry", result
