"""Email senders behind one interface, chosen by EMAIL_BACKEND (console | smtp)."""

from __future__ import annotations

import logging
import os
import smtplib
import ssl
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage

from app.observability import metrics

log = logging.getLogger(__name__)


@dataclass
class SendResult:
    success: bool
    message: str
    refused: tuple[str, ...] = ()


@dataclass
class Delivery:
    """Outcome of one message of a bulk job: `sent`, `failed` (permanent) or `retry` (transient)."""

    status: str
    message: str
    code: int | None = None


class BatchTransport(ABC):
    """Sends many messages, one after another, over whatever connection it keeps open.

    `before_data`, when given, is called at the message's point of no return: before it, the message
    cannot have been delivered (SMTP: a transaction the server has not got the end of DATA of is
    discarded), after it, it may have been. A bulk job records that moment, so a worker lost before it
    leaves a message that is safe to send again (app.email.bulk). Should `before_data` raise, the
    message is not sent and the exception propagates."""

    @abstractmethod
    def deliver(self, message: EmailMessage, before_data: Callable[[], None] | None = None) -> Delivery:
        """Deliver one message (one recipient); never raises for delivery problems."""

    def close(self) -> None:
        """Release the connection (the default keeps none)."""
        return None


class EmailSender(ABC):
    @abstractmethod
    def send(self, message: EmailMessage) -> SendResult:
        """Deliver `message`; never raises for delivery problems (they are reported in the result)."""

    def open_batch(self) -> BatchTransport:
        """A transport for a bulk job (the default sends each message on its own)."""
        return _PerMessageTransport(self)


class _PerMessageTransport(BatchTransport):
    def __init__(self, sender: EmailSender) -> None:
        self.sender = sender

    def deliver(self, message: EmailMessage, before_data: Callable[[], None] | None = None) -> Delivery:
        if before_data is not None:  # the whole send is the point of no return here
            _guarded(before_data)()
        result = self.sender.send(message)
        return Delivery("sent" if result.success and not result.refused else "failed", result.message)


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
        result = self._send(message)
        metrics.count_smtp("sent" if result.success else "failed")
        return result

    def _send(self, message: EmailMessage) -> SendResult:
        try:
            with self.connect() as smtp:
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


    def connect(self) -> smtplib.SMTP:
        smtp = _SMTP(self.host, self.port, timeout=self.timeout)
        try:
            smtp.ehlo()
            if self.starttls:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if self.username:
                smtp.login(self.username, self.password)
        except BaseException:
            smtp.close()
            raise
        return smtp

    def open_batch(self) -> BatchTransport:
        return SmtpBatchTransport(self)


class NotSent(Exception):
    """`before_data` failed (its cause chained): the message was not sent."""


def _guarded(hook: Callable[[], None] | None) -> Callable[[], None] | None:
    if hook is None:
        return None

    def call() -> None:
        try:
            hook()
        except Exception as exc:
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc

    return call


class _SMTP(smtplib.SMTP):
    """smtplib.SMTP calling `before_data` (if set) once MAIL FROM and RCPT TO were accepted, right before
    DATA: the message's point of no return (BatchTransport)."""

    before_data: Callable[[], None] | None = None
    in_data = False  # DATA was sent: from here a lost connection leaves the message's fate unknown

    def data(self, msg):
        hook = self.before_data
        if hook is not None:
            hook()
        self.in_data = True
        return super().data(msg)


class SmtpBatchTransport(BatchTransport):
    """One SMTP connection reused for many messages; reconnects after a drop.

    4xx answers, dropped connections and timeouts are transient (`retry`); 5xx answers are
    permanent (`failed`), e.g. a refused recipient. A failed AUTH is permanent for the whole job. A
    connection lost or timed out during DATA is `failed`, never retried: the server may have taken
    the message before it went silent, and a retry could deliver it twice."""

    def __init__(self, sender: SmtpEmailSender) -> None:
        self.sender = sender
        self.smtp: smtplib.SMTP | None = None

    def deliver(self, message: EmailMessage, before_data: Callable[[], None] | None = None) -> Delivery:
        delivery = self._deliver(message, before_data)
        metrics.count_smtp(delivery.status)
        return delivery

    def _deliver(self, message: EmailMessage, before_data: Callable[[], None] | None = None) -> Delivery:
        try:
            if self.smtp is None:
                self.smtp = self.sender.connect()
            self.smtp.before_data = _guarded(before_data)
            self.smtp.in_data = False
            try:
                refused = self.smtp.send_message(message)
            finally:
                if self.smtp is not None:
                    self.smtp.before_data = None
        except NotSent:
            self._reset()  # MAIL/RCPT were accepted: end that transaction, keep the connection
            raise
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = next(iter(exc.recipients.values()), (550, b"refused"))
            self._reset()
            return Delivery("retry" if 400 <= code < 500 else "failed", f"Recipient refused: {code} {_text(text)}",
                            code)
        except smtplib.SMTPAuthenticationError as exc:
            self.close()
            return Delivery("failed", "SMTP authentication failed.", exc.smtp_code)
        except smtplib.SMTPResponseException as exc:
            code = exc.smtp_code
            if code == 421 or not 400 <= code < 600:
                self.close()
            else:
                self._reset()
            return Delivery("retry" if code < 500 or code == 421 else "failed",
                            f"SMTP server answered {code}: {_text(exc.smtp_error)}", code)
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            in_data = bool(self.smtp is not None and self.smtp.in_data)
            self.close()
            if in_data:
                return Delivery("failed", f"SMTP connection lost during DATA ({type(exc).__name__}): the message "
                                          "may have been delivered; not resent, to never deliver twice.")
            return Delivery("retry", f"SMTP connection problem: {type(exc).__name__}.")
        if refused:
            code, text = next(iter(refused.values()))
            return Delivery("failed", f"Recipient refused: {code} {_text(text)}", code)
        return Delivery("sent", "Sent.", 250)

    def _reset(self) -> None:
        try:
            if self.smtp is not None:
                self.smtp.rset()
        except (smtplib.SMTPException, OSError):
            self.close()

    def close(self) -> None:
        if self.smtp is not None:
            try:
                self.smtp.quit()
            except (smtplib.SMTPException, OSError):
                self.smtp.close()
            self.smtp = None


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
