"""Unbound extensions, bound to the app in `create_app()` in a fixed order."""

from __future__ import annotations

from celery import Celery
from flask_smorest import Api as _Api
from flask_smorest import Blueprint as _Blueprint
from flask_smorest.arguments import ArgumentsMixin
from marshmallow import Schema, fields
from webargs import core
from webargs.flaskparser import FlaskParser

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


class SafeParser(FlaskParser):
    """webargs parser whose JSON comes from `app.jsonbody.loads` (depth, digits, NUL, surrogates) and
    that answers 415 for a body of another type where JSON is expected (webargs ignores it)."""

    DEFAULT_VALIDATION_STATUS = 400  # schema failures are 400 VALIDATION_ERROR, not webargs' 422

    def _raw_load_json(self, req):
        from app.jsonbody import loads, require_json_body

        if not require_json_body(req):
            return core.missing
        return loads(req.get_data(cache=True))


ArgumentsMixin.ARGUMENTS_PARSER = SafeParser()
Blueprint = _Blueprint

celery_app = Celery("platform_gateway")

__all__ = ["Api", "Blueprint", "SuccessSchema", "celery_app", "db"]
