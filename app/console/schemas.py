"""Wire shapes of the console's own endpoints (development sign-in)."""

from __future__ import annotations

import re

from marshmallow import RAISE, Schema, ValidationError, fields, validate

ROLES = ("admin", "super_admin")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}")


def valid_name(value: str) -> bool:
    """Org, user and product names a console session accepts (the characters ids use)."""
    return _NAME.fullmatch(value) is not None  # fullmatch: `$` would let a trailing newline in


def _name(value: str) -> None:
    if not valid_name(value):
        raise ValidationError("Use 1-128 letters, digits and . _ @ : - (starting with a letter or digit).")


class DevSignInRequest(Schema):
    """Body of `POST /console/session` (development sign-in): the identity the session acts as."""

    class Meta:
        unknown = RAISE

    orgId = fields.String(required=True, validate=_name)
    userId = fields.String(load_default="dev-user", validate=_name)
    role = fields.String(load_default=None, allow_none=True, validate=validate.OneOf(ROLES))
    product = fields.String(load_default=None, allow_none=True, validate=_name)
    email = fields.Email(load_default=None, allow_none=True, validate=validate.Length(max=254))

