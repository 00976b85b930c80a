"""Strict JSON field types and the JSON Schema checks shared by every registry schema.

marshmallow's stock Boolean/Float accept strings ("yes", "0.5"); a registry document must keep
the JSON types the caller meant, so these fields accept only real JSON booleans and numbers.
`StrictInt` / `QueryInt` are the integer field of every request schema of every domain (a test walks
the routes' schemas to keep it so), as `NulFree` is the base of their request schemas.
"""

from __future__ import annotations

import functools
import json
import math
import re
from datetime import UTC
from typing import Any

from jsonschema.exceptions import SchemaError
from marshmallow import Schema, ValidationError, fields, pre_load, validate
from marshmallow import validate as _validate

from app.jsonbody import BoundedJson, size_error
from app.jsonschema_safe import check_schema, validator_for

MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
MACHINE_NAME_MESSAGE = ("Must start with a letter or digit and contain only letters, digits, "
                        "'_', '.', ':' or '-' (at most 128 characters).")
SERVER_FIELDS = ("id", "orgId", "product", "createdAt", "updatedAt", "createdBy", "updatedBy")


class StrictBool(fields.Boolean):
    """Only JSON `true` / `false`."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


class StrictFloat(fields.Float):
    """A JSON number (integer or fraction); strings and booleans are refused."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid", input=value)
        return super()._deserialize(value, attr, data, **kwargs)


# PostgreSQL `integer`: the columns integer fields end up in (versions, positions, counts) hold 32 bits
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_QUERY_INT = re.compile(r"^-?[0-9]{1,10}$")


class StrictInt(fields.Integer):
    """The integer field of every request schema (body and query string, every domain).

    A JSON integer: 2.0 is taken as 2 (JSON has one number type, and JSON Schema's `integer` — what the
    OpenAPI document says — includes it), while 2.5, 2.589e-42, strings and booleans are refused. The
    value must also fit PostgreSQL `integer` (-2147483648..2147483647): the field's own `Range` applies,
    and the 32-bit bound closes whichever side it leaves open (documented as `minimum`/`maximum`), so
    `1e300` or 2**40 is a 400 naming the field, never a database error."""

    def __init__(self, *, validate=None, **kwargs):
        validators = [] if validate is None else list(validate) if isinstance(validate, list | tuple) else [validate]
        ranges = [v for v in validators if isinstance(v, _validate.Range)]
        low = None if any(r.min is not None and r.min >= INT32_MIN for r in ranges) else INT32_MIN
        high = None if any(r.max is not None and r.max <= INT32_MAX for r in ranges) else INT32_MAX
        if low is not None or high is not None:
            validators.append(_validate.Range(min=low, max=high))
        super().__init__(strict=True, validate=validators, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return super()._deserialize(value, attr, data, **kwargs)


class QueryInt(StrictInt):
    """`StrictInt` for the query string, whose values are text: ASCII decimal digits with an optional
    minus sign ("1_000", "1.0", " 5", "١٠" and "+5", which Python's int() reads, are refused)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, str) or not _QUERY_INT.match(value):
            raise self.make_error("invalid", input=value)
        return super()._deserialize(int(value), attr, data, **kwargs)


class UtcTimestamp(fields.DateTime):
    """An ISO 8601 timestamp, stored normalised to UTC as `YYYY-MM-DDTHH:MM:SSZ` (no offset = UTC)."""

    def __init__(self, **kwargs):
        super().__init__(format="iso", **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        moment = super()._deserialize(value, attr, data, **kwargs)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        try:
            moment = moment.astimezone(UTC)
        except (OverflowError, ValueError):
            raise self.make_error("invalid", input=value, obj_type="datetime") from None
        return moment.replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def non_finite_paths(value: Any, path: str = "") -> list[str]:
    """Where `value` holds a number that is not finite: `1e400` is JSON syntax but parses to infinity
    (app.jsonbody refuses the NaN/Infinity literals), which JSONB cannot store."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite_paths(v, f"{path}[{i}]")]
    return []


class NulFree(Schema):
    """Base of every request schema: no number the database cannot store (named by path, before any
    field is read). A NUL character anywhere in a request is the parser's one rule (app.jsonbody:
    the body, the query string and the path alike), so no schema checks it again."""

    @pre_load
    def _refuse_non_finite(self, data, **_):
        paths = non_finite_paths(data)
        if paths:
            raise ValidationError({p: ["Numbers must be finite."] for p in paths})
        return data


def machine_name(**kwargs) -> fields.String:
    return fields.String(validate=validate.Regexp(MACHINE_NAME, error=MACHINE_NAME_MESSAGE), **kwargs)


def text(max_length: int, *, min_length: int = 0, **kwargs) -> fields.String:
    return fields.String(validate=validate.Length(min=min_length, max=max_length), **kwargs)


def string_list(max_items: int = 100, max_length: int = 500, **kwargs) -> fields.List:
    return fields.List(fields.String(validate=validate.Length(min=1, max=max_length)),
                       validate=validate.Length(max=max_items), **kwargs)


def check_json_schema(value: Any) -> None:
    """Raise ValidationError unless `value` is a valid JSON Schema (draft from `$schema`, else 2020-12)."""
    if not isinstance(value, dict):
        raise ValidationError("Must be a JSON Schema object.")
    problem = _schema_problem(json.dumps(value, sort_keys=True))
    if problem:
        raise ValidationError(problem)


@functools.lru_cache(maxsize=4096)
def _schema_problem(canonical: str) -> str | None:
    # Checking a schema against its metaschema costs milliseconds; agents repeat the same tool
    # schemas over and over, so the verdict is cached by the schema's canonical JSON.
    value = json.loads(canonical)
    try:
        check_schema(value)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        suffix = f" (at /{where})" if where else ""
        return f"Not a valid JSON Schema: {exc.message}{suffix}"
    except Exception as exc:  # unresolvable $schema or similar
        return f"Not a valid JSON Schema: {exc}"
    return None


def check_object_schema(value: Any) -> None:
    """A tool's input schema: valid JSON Schema describing an object (arguments are named)."""
    check_json_schema(value)
    if value and value.get("type") != "object":
        raise ValidationError("A tool input schema must have \"type\": \"object\".")


def json_schema(**kwargs) -> fields.Dict:
    return BoundedJson("JSON_SCHEMA_MAX_BYTES", validate=check_json_schema,
                       metadata={"description": "A JSON Schema object"}, **kwargs)


def schema_object(**kwargs) -> fields.Dict:
    """A JSON Schema field with its own validation (e.g. `check_object_schema`), bounded like `json_schema`."""
    return BoundedJson("JSON_SCHEMA_MAX_BYTES", **kwargs)


def free_json(**kwargs) -> fields.Dict:
    """A free-form JSON object (metadata, config…), at most JSON_FIELD_MAX_BYTES (app.jsonbody.BoundedJson)."""
    return BoundedJson("JSON_FIELD_MAX_BYTES", **kwargs)


def check_open_object(data: Any, setting: str = "JSON_FIELD_MAX_BYTES") -> None:
    """`@validates_schema` helper for a nested object that keeps unknown fields as sent (its named
    fields are checked one by one, the rest only here): the whole object within the setting's limit."""
    problem = size_error(data, setting)
    if problem:
        raise ValidationError(problem)


def schema_errors(schema: dict, instance: Any, limit: int = 20) -> list[str]:
    """Messages for every way `instance` fails `schema` (empty when it validates)."""
    validator = validator_for(schema)
    messages = []
    try:
        errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except Exception as exc:  # e.g. a $ref that cannot be resolved (remote refs are never fetched)
        return [f"The schema cannot be applied: {exc}"[:500]]
    for error in errors:
        where = "/".join(str(p) for p in error.absolute_path)
        messages.append(f"{error.message}" + (f" (at /{where})" if where else ""))
        if len(messages) >= limit:
            break
    return messages


def check_config(data: dict, *, schema_key: str, config_key: str) -> None:
    """`@validates_schema` helper: data[config_key] must validate against data[schema_key]."""
    schema, config = data.get(schema_key), data.get(config_key)
    if isinstance(schema, dict) and config is not None:
        errors = schema_errors(schema, config)
        if errors:
            raise ValidationError(errors, field_name=config_key)
