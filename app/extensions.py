"""Unbound extensions, bound to the app in `create_app()` in a fixed order."""

from __future__ import annotations

from celery import Celery
from flask_smorest import Api as _Api
from flask_smorest import Blueprint as _Blueprint
from flask_smorest.arguments import ArgumentsMixin
from marshmallow import Schema, fields

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


# Schema failures are 400 VALIDATION_ERROR here, not webargs' 422 (documented as such in OpenAPI).
ArgumentsMixin.ARGUMENTS_PARSER.DEFAULT_VALIDATION_STATUS = 400
Blueprint = _Blueprint

celery_app = Celery("platform_gateway")

__all__ = ["Api", "Blueprint", "SuccessSchema", "celery_app", "db"]
