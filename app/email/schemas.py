"""Wire shapes of the email routes (spec: SendEmailRequest, SendEmailResponse)."""

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates

MAX_RECIPIENTS = 50
MAX_BODY_CHARS = 1_000_000


class SendEmailRequestSchema(Schema):
    class Meta:
        unknown = RAISE

    to = fields.List(fields.Email(), required=True,
                     validate=validate.Length(min=1, max=MAX_RECIPIENTS),
                     metadata={"description": f"1–{MAX_RECIPIENTS} recipient addresses"})
    subject = fields.String(required=True, validate=validate.Length(min=1, max=998))
    body = fields.String(required=True, validate=validate.Length(min=1, max=MAX_BODY_CHARS),
                         metadata={"description": "Already-rendered HTML or plain text"})

    @validates("subject")
    def _single_line(self, value: str, **_kwargs) -> None:
        if "\r" in value or "\n" in value:  # header injection
            raise ValidationError("Subject must be a single line.")
        if any(ch < " " and ch != "\t" or ch == "\x7f" for ch in value):  # NUL and other controls
            raise ValidationError("Subject must not contain control characters (NUL, …).")


class SendEmailResponseSchema(Schema):
    success = fields.Boolean(required=True)
    message = fields.String(metadata={"description": "Provider detail or the reason it failed"})
