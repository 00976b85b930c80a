"""Unbound extensions, bound to the app in `create_app()` in a fixed order."""

from __future__ import annotations

from apispec import BasePlugin
from celery import Celery
from flask_smorest import Api as _Api
from flask_smorest import Blueprint as _Blueprint
from flask_smorest.arguments import ArgumentsMixin
from marshmallow import Schema, fields
from webargs import core
from webargs.flaskparser import FlaskParser

from app.auth import require
from app.db import db


class ErrorBodySchema(Schema):
    code = fields.String(required=True, metadata={"example": "VALIDATION_ERROR"})
    message = fields.String(required=True)
    details = fields.Dict()


class ErrorMetadataSchema(Schema):
    success = fields.Boolean(required=True, metadata={"example": False})
    timestamp = fields.Integer(required=True)


class ErrorEnvelopeSchema(Schema):
    """The error envelope every error of every route uses."""

    error = fields.Nested(ErrorBodySchema, required=True)
    metadata = fields.Nested(ErrorMetadataSchema, required=True)


class SuccessSchema(Schema):
    """The spec's "success indicator"."""

    success = fields.Boolean(required=True, metadata={"example": True})


class _CrossFieldRules(BasePlugin):
    """Rules that span fields, stated in OpenAPI: a schema class's `OPENAPI_EXTRA` (e.g. `anyOf`
    branches) is merged into its component, so the documented schema says what the code enforces."""

    def schema_helper(self, name, definition, **kwargs):
        schema = kwargs.get("schema")
        extra = getattr(schema if isinstance(schema, type) else type(schema), "OPENAPI_EXTRA", None)
        return dict(extra) if extra else None


_ANY_OBJECT = {"type": "object", "nullable": True}


def _nullable_nested(converter, field, ret) -> dict:
    """A nullable nested object as OpenAPI 3.0 writes it (`allOf: [$ref]` + `nullable`): apispec adds an
    `anyOf` branch `{type: object}` instead, which documents any object at all as valid."""
    branches = ret.get("anyOf")
    if field.allow_none and isinstance(branches, list) and _ANY_OBJECT in branches:
        ret.pop("anyOf")
        return {"allOf": [b for b in branches if b != _ANY_OBJECT], "nullable": True}
    return {}


class Api(_Api):
    ERROR_SCHEMA = ErrorEnvelopeSchema

    def _init_spec(self, *, extra_plugins=None, **kwargs):
        super()._init_spec(extra_plugins=[*(extra_plugins or ()), _CrossFieldRules()], **kwargs)
        self.ma_plugin.converter.add_attribute_function(_nullable_nested)


class SafeParser(FlaskParser):
    """webargs parser whose JSON comes from `app.jsonbody.loads` (depth, digits, NUL, surrogates) and
    that answers 415 for a body of another type where JSON is expected (webargs ignores it)."""

    DEFAULT_VALIDATION_STATUS = 400  # schema failures are 400 VALIDATION_ERROR, not webargs' 422

    def _raw_load_json(self, req):
        from app.jsonbody import loads, require_json_body

        if not require_json_body(req):
            return core.missing
        return loads(req.get_data(cache=True))


class Blueprint(_Blueprint):
    """flask-smorest's Blueprint, plus who may call each operation: enforced and documented at once.

    `@blp.requires(*scopes, roles=...)` (app.auth.require) enforces; every operation of an API
    blueprint is documented with the bearer security and a 401, and those with declared scopes or
    roles with a 403, from the markers the decorator leaves on the view."""

    @staticmethod
    def requires(*scopes: str, roles: tuple[str, ...] = ()):
        return require(*scopes, roles=roles)

    def _store_endpoint_docs(self, endpoint, obj, parameters, tags, **options):
        super()._store_endpoint_docs(endpoint, obj, parameters, tags, **options)
        view_class = obj if isinstance(obj, type) else None
        for method, doc in self._docs[endpoint].items():
            if method == "parameters":
                continue
            view = getattr(view_class, method, None) if view_class is not None else obj
            _document_access(doc, getattr(view, "_required_scopes", None), getattr(view, "_required_roles", None))
            _document_limits(doc, getattr(view, "_rate_limit_group", None))


def _document_access(doc: dict, scopes, roles) -> None:
    responses = doc.setdefault("response", {}).setdefault("responses", {})
    doc.setdefault("manual_doc", {}).setdefault("security", [{"bearerAuth": []}])
    _add_response(responses, 401, "UNAUTHORIZED: missing, invalid or expired token")
    needs = []
    if roles:
        needs.append(f"role {' or '.join(roles)}")
    if scopes:
        needs.append(f"one of the scopes {', '.join(scopes)}")
    if needs:
        _add_response(responses, 403, f"FORBIDDEN: the token lacks {' and '.join(needs)}")


def _document_limits(doc: dict, rate_limit_group: str | None) -> None:
    """413 and 415 for an operation with a JSON body (MAX_CONTENT_LENGTH, app.jsonbody), 429 for one
    under a per-organization rate limit (app.ratelimit: `rate_limited` / `may_be_rate_limited`)."""
    responses = doc.setdefault("response", {}).setdefault("responses", {})
    arguments = doc.get("arguments", {}).get("parameters", [])
    if any(argument.get("location", "json") == "json" for argument in arguments):
        _add_response(responses, 413, "PAYLOAD_TOO_LARGE: the body exceeds MAX_CONTENT_LENGTH")
        _add_response(responses, 415, "INVALID_INPUT: the body is not application/json")
    if rate_limit_group:
        _add_response(responses, 429, f"RATE_LIMITED: the organization's `{rate_limit_group}` limit is spent; "
                                      "Retry-After says when to try again")


def _add_response(responses: dict, status: int, description: str) -> None:
    """Like `alt_response`, unless the view documents that status itself."""
    if status not in responses and str(status) not in responses:
        responses[status] = [{"schema": ErrorEnvelopeSchema(), "description": description, "content_type": None}]


# Schema failures are 400 VALIDATION_ERROR here, not webargs' 422 (documented as such in OpenAPI); JSON
# bodies go through app.jsonbody.
ArgumentsMixin.ARGUMENTS_PARSER = SafeParser()

celery_app = Celery("platform_gateway")

__all__ = ["Api", "Blueprint", "SuccessSchema", "celery_app", "db"]
