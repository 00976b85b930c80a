"""Unbound extensions, bound to the app in `create_app()` in a fixed order."""

from __future__ import annotations

from celery import Celery
from flask_smorest import Api as _Api
from flask_smorest import Blueprint as _Blueprint
from flask_smorest.arguments import ArgumentsMixin
from marshmallow import Schema, fields

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


class Api(_Api):
    ERROR_SCHEMA = ErrorEnvelopeSchema


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


def _add_response(responses: dict, status: int, description: str) -> None:
    """Like `alt_response`, unless the view documents that status itself."""
    if status not in responses and str(status) not in responses:
        responses[status] = [{"schema": ErrorEnvelopeSchema(), "description": description, "content_type": None}]


# Schema failures are 400 VALIDATION_ERROR here, not webargs' 422 (documented as such in OpenAPI).
ArgumentsMixin.ARGUMENTS_PARSER.DEFAULT_VALIDATION_STATUS = 400

celery_app = Celery("platform_gateway")

__all__ = ["Api", "Blueprint", "SuccessSchema", "celery_app", "db"]
