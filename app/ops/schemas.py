"""Wire shapes of the operations routes."""

from marshmallow import Schema, fields


class IdentitySchema(Schema):
    orgId = fields.String(required=True)
    userId = fields.String(required=True)
    email = fields.String(allow_none=True)
    role = fields.String(allow_none=True)
    scopes = fields.List(fields.String(), required=True)
    product = fields.String(required=True)
