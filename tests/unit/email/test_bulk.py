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
