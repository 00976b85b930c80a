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
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, missing, pre_load, validate
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


def clean_json_check(hook):
    """Marks a `pre_load` hook that refuses only what `is_clean_json` refuses (a non-finite number, a lone
    surrogate): a fast lane (`FastLane`) runs that one C-speed check for it instead."""
    hook.clean_json_check = True
    return hook


def is_clean_json(value: Any) -> bool:
    """True when `value` is JSON with finite numbers and text encodable as UTF-8 (one C-speed pass)."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, TypeError):  # NaN/Infinity, a lone surrogate (UnicodeEncodeError), not JSON
        return False
    return True


class NulFree(Schema):
    """Base of every request schema: no number the database cannot store (named by path, before any
    field is read). A NUL character anywhere in a request is the parser's one rule (app.jsonbody:
    the body, the query string and the path alike), so no schema checks it again."""

    @pre_load
    @clean_json_check
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


# --- fast lanes derived from their schema ----------------------------------------------------------
# marshmallow's load costs tens of µs per body (hooks, error store, per-field machinery): most of the CPU of
# an analytics batch or a record query's fixed cost. A `FastLoad` schema's `load` first tries its fast lane,
# which `FastLane` derives from the schema itself, once: its declared fields (type, required, allow_none,
# load_default, data_key), their validators (Length and Range inline, any other called as it is) and the
# schema's hooks (pre_load, @validates, @validates_schema, post_load, called as marshmallow calls them;
# a `clean_json_check` pre_load hook by one `is_clean_json` pass). The lane returns exactly what the
# schema's load returns, or declines (None) on anything it is not sure of — any validation error, a value
# of another class, an unknown key under RAISE, a field type it does not know by heart — and the schema
# then runs and reports as before. A rule changed in the schema is a rule changed in the lane: they
# cannot drift (tests/unit/test_fast_lane.py checks both on random input).

class _Decline(Exception):
    """The fast lane is not sure: marshmallow decides."""


_STR = {str}


def _length_check(rule: _validate.Length):
    low, high, equal = rule.min, rule.max, rule.equal

    def check(value):
        n = len(value)
        if (equal is not None and n != equal) or (low is not None and n < low) or (high is not None and n > high):
            raise _Decline
    return check


def _range_check(rule: _validate.Range):
    low, high, low_in, high_in = rule.min, rule.max, rule.min_inclusive, rule.max_inclusive

    def check(value):
        if low is not None and (value < low if low_in else value <= low):
            raise _Decline
        if high is not None and (value > high if high_in else value >= high):
            raise _Decline
    return check


def _call_check(rule):
    def check(value):
        if rule(value) is False:
            raise _Decline
    return check


def _validators(field: fields.Field):
    checks = [_length_check(v) if type(v) is _validate.Length else _range_check(v) if type(v) is _validate.Range
              else _call_check(v) for v in field.validators]
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]

    def check_all(value):
        for check in checks:
            check(value)
    return check_all


def _plain(field: fields.Field, base: type) -> bool:
    """`field` deserializes as `base` does (the class itself, or a subclass that changes no loading)."""
    return isinstance(field, base) and type(field)._deserialize is base._deserialize


def _typed(field: fields.Field):
    """A converter of a non-None value of `field` (raises _Decline when unsure), without validators."""
    if _plain(field, fields.String):
        def string(value):
            if value.__class__ is not str:
                raise _Decline
            return value
        return string
    if type(field) is StrictInt:
        def integer(value):
            if value.__class__ is not int:
                raise _Decline
            return value
        return integer
    if _plain(field, fields.Dict) and field.value_field is None and (
            field.key_field is None or (_plain(field.key_field, fields.String) and not field.key_field.validators)):
        keyed = field.key_field is not None

        def mapping(value):
            if value.__class__ is not dict or (keyed and value and {*map(type, value)} != _STR):
                raise _Decline
            return dict(value)
        return mapping
    if _plain(field, fields.List):
        inner = _converter(field.inner)

        def listing(value):
            if value.__class__ is not list:
                raise _Decline
            return [inner(item) for item in value]
        return listing
    if (_plain(field, fields.Nested) and not field.many and field.only is None and not field.exclude
            and isinstance(field.nested, type | Schema)):
        lanes: list[FastLane] = []

        def nested(value):
            if not lanes:  # built on first use: a schema may nest itself
                lanes.append(FastLane(field.schema, unknown=field.unknown))
            return lanes[0].run(field.schema, value)
        return nested
    if _plain(field, fields.Raw):
        return lambda value: value
    if isinstance(field, fields.Method | fields.Function | fields.Pluck):
        def unknown_kind(value):
            raise _Decline
        return unknown_kind

    def generic(value):  # the field's own deserialize (validators and None included)
        return field.deserialize(value)
    generic.complete = True
    return generic


def _bounds(field: fields.Field) -> tuple[Any, Any] | None:
    """(low, high), inclusive, that the field's validators amount to when they are only Length (of a
    string) or Range (of an integer) rules; None otherwise."""
    low, high = -math.inf, math.inf
    for rule in field.validators:
        if _plain(field, fields.String) and type(rule) is _validate.Length and rule.equal is None:
            pass
        elif type(field) is StrictInt and type(rule) is _validate.Range and rule.min_inclusive and rule.max_inclusive:
            pass
        else:
            return None
        low = low if rule.min is None else max(low, rule.min)
        high = high if rule.max is None else min(high, rule.max)
    return low, high


def _converter(field: fields.Field):
    """The fast lane's loader of one field value (present in the input)."""
    allow_none = field.allow_none
    bounds = _bounds(field)
    if bounds is not None and (_plain(field, fields.String) or type(field) is StrictInt):
        # the usual field, in one step: a string within its lengths, an integer within its range
        kind, measure, (low, high) = (str, len, bounds) if _plain(field, fields.String) else (int, None, bounds)

        def bounded(value):
            if value.__class__ is kind:
                if low <= (measure(value) if measure else value) <= high:
                    return value
            elif value is None and allow_none:
                return None
            raise _Decline
        return bounded
    typed = _typed(field)
    if getattr(typed, "complete", False):
        return typed
    check = _validators(field)

    def convert(value):
        if value is None:
            if allow_none:
                return None
            raise _Decline
        value = typed(value)
        if check is not None:
            check(value)
        return value
    return convert


class FastLane:
    """What `schema.load(data)` returns, derived from the schema (see above); `run` raises _Decline."""

    def __init__(self, schema: Schema, *, unknown: str | None = None) -> None:
        self.unknown = unknown or schema.unknown
        if self.unknown not in (RAISE, EXCLUDE):
            raise TypeError(f"{type(schema).__name__}: a fast lane keeps unknown=RAISE or EXCLUDE")
        hooks = schema._hooks
        ordered = [(attr, kw) for collection in (True, False) for attr, many, kw in hooks["pre_load"]
                   if many is collection]
        self.precheck = any(getattr(getattr(schema, attr), "clean_json_check", False) for attr, _ in ordered)
        self.pre_load = [(attr, kw.get("pass_original", False)) for attr, kw in ordered
                         if not getattr(getattr(schema, attr), "clean_json_check", False)]
        self.fields = []
        for name, field in schema.load_fields.items():
            attr = field.attribute or name
            if "." in attr:
                raise TypeError(f"{type(schema).__name__}.{name}: a dotted attribute")
            self.fields.append((field.data_key or name, attr, field.required, field.load_default,
                                _converter(field)))
        self.by_key = {key: (attr, convert) for key, attr, _, _, convert in self.fields}
        self.absent = [(key, attr, required, default) for key, attr, required, default, _ in self.fields
                       if required or default is not missing]

        by_key = {name: (field.data_key or name, field.attribute or name) for name, field in schema.load_fields.items()}
        self.validates = [(attr, by_key[name]) for attr, _, kw in hooks["validates"] for name in kw["field_names"]
                          if name in by_key]
        self.schema_checks = [(attr, kw.get("pass_original", False)) for collection in (True, False)
                              for attr, many, kw in hooks["validates_schema"] if many is collection]
        self.post_load = [(attr, kw.get("pass_original", False)) for collection in (True, False)
                          for attr, many, kw in hooks["post_load"] if many is collection]
        self.hooked = bool(self.pre_load or self.validates or self.schema_checks or self.post_load)
        self.exclude = self.unknown == EXCLUDE

    def run(self, schema: Schema, data: Any) -> dict:
        if data.__class__ is not dict or (self.precheck and not is_clean_json(data)):
            raise _Decline
        if not self.hooked:
            return self._fields(data)
        options = {"many": False, "partial": schema.partial, "unknown": self.unknown}
        original = data
        for attr, pass_original in self.pre_load:
            hook = getattr(schema, attr)
            data = hook(data, original, **options) if pass_original else hook(data, **options)
            if data.__class__ is not dict:
                raise _Decline
        out = self._fields(data)
        for attr, (key, field_attr) in self.validates:
            if field_attr in out:
                getattr(schema, attr)(out[field_attr], data_key=key)
        for attr, pass_original in self.schema_checks:
            hook = getattr(schema, attr)
            hook(out, original, **options) if pass_original else hook(out, **options)
        for attr, pass_original in self.post_load:
            hook = getattr(schema, attr)
            out = hook(out, original, **options) if pass_original else hook(out, **options)
        return out

    def _fields(self, data: dict) -> dict:
        out = {}
        by_key = self.by_key
        for key, value in data.items():
            found = by_key.get(key)
            if found is not None:
                out[found[0]] = found[1](value)
            elif not self.exclude:
                raise _Decline  # an unknown key under RAISE
        for key, attr, required, default in self.absent:
            if key not in data:
                if required:
                    raise _Decline
                out[attr] = default() if callable(default) else default
        return out

    def load(self, schema: Schema, data: Any) -> dict | None:
        """The schema's load of `data`, or None when marshmallow must look at it."""
        try:
            return self.run(schema, data)
        except (_Decline, ValidationError):
            return None


_LANES: dict[type, FastLane] = {}


class FastLoad(Schema):
    """A request schema whose `load` takes the fast lane derived from it (`FastLane`) and runs
    marshmallow only when the lane declines: the same result, the same errors, a fraction of the cost."""

    def load(self, data, *, many=None, partial=None, unknown=None):
        lane = _LANES.get(type(self)) if many is None and partial is None else None
        if lane is None and many is None and partial is None:
            lane = _LANES[type(self)] = FastLane(type(self)())
        if (lane is not None and (unknown is None or unknown == self.unknown) and not self.many
                and self.unknown == lane.unknown and self.only is None and not self.exclude and not self.load_only
                and not self.dump_only and not self.partial):
            found = lane.load(self, data)
            if found is not None:
                return found
        return super().load(data, many=many, partial=partial, unknown=unknown)
