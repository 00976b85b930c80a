"""Wire shapes of the email routes (SendEmailRequest, SendEmailResponse, bulk send, newsletter)."""

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

# NulFree: no NUL characters anywhere in the input (PostgreSQL cannot store them)
from app.fields import NulFree, QueryInt

MAX_RECIPIENTS = 50
MAX_BODY_CHARS = 1_000_000


def _single_line(value: str) -> None:
    if "\r" in value or "\n" in value:  # header injection
        raise ValidationError("Subject must be a single line.")
    if any(ch < " " and ch != "\t" or ch == "\x7f" for ch in value):  # NUL and other controls
        raise ValidationError("Subject must not contain control characters (NUL, …).")


def subject_field(**kwargs) -> fields.String:
    """An email subject: 1–998 characters on one line (a CR/LF would inject headers), no control
    characters."""
    return fields.String(validate=[validate.Length(min=1, max=998), _single_line], **kwargs)


class SendEmailRequestSchema(Schema):
    class Meta:
        unknown = RAISE

    to = fields.List(fields.Email(), required=True,
                     validate=validate.Length(min=1, max=MAX_RECIPIENTS),
                     metadata={"description": f"1–{MAX_RECIPIENTS} recipient addresses"})
    subject = subject_field(required=True)
    body = fields.String(required=True, validate=validate.Length(min=1, max=MAX_BODY_CHARS),
                         metadata={"description": "Already-rendered HTML or plain text"})


class SendEmailResponseSchema(Schema):
    success = fields.Boolean(required=True)
    message = fields.String(metadata={"description": "Provider detail or the reason it failed"})


# --------------------------------------------------------------------------- bulk send


class BulkMessageSchema(NulFree):
    class Meta:
        unknown = RAISE

    to = fields.Email(required=True, metadata={"description": "one recipient address"})
    subject = subject_field(required=True)
    body = fields.String(required=True, validate=validate.Length(min=1, max=MAX_BODY_CHARS))


MAX_BULK = 10_000


class BulkSendRequestSchema(NulFree):
    """Either `messages` (each its own recipient, subject, body) or one `subject` + `body` to `recipients`."""

    class Meta:
        unknown = RAISE

    messages = fields.List(fields.Nested(BulkMessageSchema), validate=validate.Length(min=1, max=MAX_BULK),
                           metadata={"description": f"1–{MAX_BULK} messages, each to one address"})
    recipients = fields.List(fields.Email(), validate=validate.Length(min=1, max=MAX_BULK),
                             metadata={"description": f"1–{MAX_BULK} addresses (duplicates sent once)"})
    subject = subject_field()
    body = fields.String(validate=validate.Length(min=1, max=MAX_BODY_CHARS))

    @validates_schema
    def _one_form(self, data, **_kwargs) -> None:
        if "messages" in data:
            extra = [k for k in ("recipients", "subject", "body") if k in data]
            if extra:
                raise ValidationError({k: ["Not allowed together with messages."] for k in extra})
            return
        missing = [k for k in ("recipients", "subject", "body") if k not in data]
        if missing:
            raise ValidationError({k: ["Required unless messages is given."] for k in missing})


class EmailJobSchema(Schema):
    id = fields.String(required=True)
    kind = fields.String(required=True, metadata={"description": "bulk or newsletter"})
    status = fields.String(required=True, metadata={"description": "queued, sending, done"})
    total = fields.Integer(required=True)
    counts = fields.Dict(keys=fields.String(), values=fields.Integer(),
                         metadata={"description": "pending, sending, sent, failed"})
    subject = fields.String(allow_none=True)
    createdBy = fields.String(allow_none=True)
    createdAt = fields.String()
    startedAt = fields.String(allow_none=True)
    finishedAt = fields.String(allow_none=True)
    error = fields.String(allow_none=True, metadata={
        "description": "why the job ended before every recipient was tried: its runs were interrupted "
                       "(worker lost, task time limit) JOB_MAX_ATTEMPTS times in a row; null otherwise"})


class EmailJobAcceptedSchema(Schema):
    jobId = fields.String(required=True)
    status = fields.String(required=True)
    total = fields.Integer(required=True, metadata={"description": "messages queued (after de-duplication)"})
    statusUrl = fields.String(required=True)


class JobEnvelopeSchema(Schema):
    job = fields.Nested(EmailJobSchema, required=True)


class DeliverySchema(Schema):
    seq = fields.Integer(required=True)
    to = fields.String(required=True)
    status = fields.String(required=True, metadata={"description": "pending, sending, sent, failed"})
    attempts = fields.Integer()
    smtpCode = fields.Integer(allow_none=True)
    error = fields.String(allow_none=True)
    sentAt = fields.String(allow_none=True)


class DeliveryListSchema(Schema):
    recipients = fields.List(fields.Nested(DeliverySchema), required=True)
    nextCursor = fields.Integer(allow_none=True, metadata={"description": "pass as `after` for the next page"})


class DeliveryQuerySchema(NulFree):
    status = fields.String(validate=validate.OneOf(("pending", "sending", "sent", "failed")))
    # seq is a PostgreSQL integer: a bigger cursor was the database's conversion error, naming nothing
    after = QueryInt(validate=validate.Range(min=-1, max=2**31 - 1))
    limit = QueryInt(load_default=100, validate=validate.Range(min=1, max=1000))


# --------------------------------------------------------------------------- newsletter


class SubscribeSchema(NulFree):
    class Meta:
        unknown = RAISE

    email = fields.Email(required=True, validate=validate.Length(max=320))
    name = fields.String(allow_none=True, validate=validate.Length(max=200))
    source = fields.String(allow_none=True, validate=validate.Length(max=100),
                           metadata={"description": "where the subscription came from (free text)"})


class SubscriberSchema(Schema):
    id = fields.String(required=True)
    email = fields.String(required=True)
    name = fields.String(allow_none=True)
    status = fields.String(required=True, metadata={"description": "active or unsubscribed"})
    source = fields.String(allow_none=True)
    createdAt = fields.String()
    updatedAt = fields.String()
    unsubscribedAt = fields.String(allow_none=True)


class SubscriberEnvelopeSchema(Schema):
    subscriber = fields.Nested(SubscriberSchema, required=True)


class SubscriberListSchema(Schema):
    subscribers = fields.List(fields.Nested(SubscriberSchema), required=True)
    nextCursor = fields.String(allow_none=True, metadata={"description": "pass as `after` for the next page"})


class SubscriberQuerySchema(NulFree):
    status = fields.String(validate=validate.OneOf(("active", "unsubscribed")))
    after = fields.String(validate=validate.Length(max=320))
    limit = QueryInt(load_default=100, validate=validate.Range(min=1, max=1000))


class IssueRequestSchema(NulFree):
    class Meta:
        unknown = RAISE

    subject = subject_field(required=True)
    body = fields.String(required=True, validate=validate.Length(min=1, max=MAX_BODY_CHARS))


class IssueListSchema(Schema):
    issues = fields.List(fields.Nested(EmailJobSchema), required=True)


class TokenQuerySchema(NulFree):
    token = fields.String(required=True, validate=validate.Length(min=1, max=2000))


class UnsubscribedSchema(Schema):
    success = fields.Boolean(required=True)
    email = fields.String(required=True)
    status = fields.String(required=True)


# --------------------------------------------------------------------------- request examples
# OpenAPI request examples: addresses of example.com (RFC 2606 reserves it; nothing is ever delivered there).
SEND_EXAMPLE = {"to": ["ann@example.com"], "subject": "Welcome", "body": "<p>Hello Ann, welcome aboard.</p>"}
BULK_SEND_EXAMPLE = {"recipients": ["ann@example.com", "bob@example.com"], "subject": "We launched",
                     "body": "<p>Our new plan is live.</p>"}
SUBSCRIBE_EXAMPLE = {"email": "ann@example.com", "name": "Ann", "source": "website"}
ISSUE_EXAMPLE = {"subject": "November news", "body": "<h1>News</h1><p>What changed this month.</p>"}
