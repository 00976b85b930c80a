"""Strict JSON field types and the JSON Schema checks shared by every registry schema.

marshmallow's stock Boolean/Float accept strings ("yes", "0.5"); a registry document must keep
the JSON types the caller meant, so these fields accept only real JSON booleans and numbers.
`StrictInt` / `QueryInt` are the integer field of every request schema of every domain (a test walks
the routes' schemas to keep it so), as `NulFree` is the base of their request schemas.
"""

from __future__ import annotations

import functools
import json
import linecache
import math
import re
from datetime import UTC
from typing import Any, NamedTuple

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
# cannot drift (tests/unit/analytics/test_fast_validation.py and tests/unit/entities/
# test_fast_request_validation.py check both on random input). The lane is straight-line Python that
# `FastLane` writes from that description and compiles once per schema class (as attrs and dataclasses do):
# a field costs a few comparisons, not a closure call. `print(Schema.fast_lane().source)` shows it.

class _Decline(Exception):
    """The fast lane is not sure: marshmallow decides."""


def _plain(field: fields.Field, base: type) -> bool:
    """`field` deserializes as `base` does (the class itself, or a subclass that changes no loading)."""
    return isinstance(field, base) and type(field)._deserialize is base._deserialize


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


class _Source:
    """The text of one generated lane function and the names it refers to (its globals)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_Decline": _Decline, "is_clean_json": is_clean_json}
        self.count = 0

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def name(self, hint: str, value: Any = None) -> str:
        self.count += 1
        name = f"_{hint}{self.count}"
        self.names[name] = value
        return name

    def literal(self, value: Any, hint: str) -> str:
        """`value` as source: itself when it is a plain literal, else a name bound to it."""
        if value is None or type(value) in (bool, int, str):
            return repr(value)
        return self.name(hint, value)


def _within(src: _Source, measure: str, low: Any, high: Any) -> str | None:
    """The condition `low <= measure <= high` (either side may be open: ±inf or None)."""
    parts = []
    if low is not None and low != -math.inf:
        parts.append(f"{src.literal(low, 'low')} <= ")
    parts.append(measure)
    if high is not None and high != math.inf:
        parts.append(f" <= {src.literal(high, 'high')}")
    return "".join(parts) if len(parts) > 1 else None


def _emit_rules(src: _Source, field: fields.Field, var: str, indent: int) -> None:
    """The field's validators on `var`: Length and Range inline, any other called (False or an error: declined)."""
    for rule in field.validators:
        if type(rule) is _validate.Length:
            if rule.equal is not None:
                src.emit(indent, f"if len({var}) != {src.literal(rule.equal, 'equal')}:")
                src.emit(indent + 1, "raise _Decline")
                continue
            condition = _within(src, f"len({var})", rule.min, rule.max)
        elif type(rule) is _validate.Range:
            below, above = "<=" if rule.min_inclusive else "<", "<=" if rule.max_inclusive else "<"
            low = None if rule.min is None else f"{src.literal(rule.min, 'low')} {below} "
            high = None if rule.max is None else f" {above} {src.literal(rule.max, 'high')}"
            condition = None if low is None and high is None else f"{low or ''}{var}{high or ''}"
        else:
            src.emit(indent, f"if {src.name('rule', rule)}({var}) is False:")
            src.emit(indent + 1, "raise _Decline")
            continue
        if condition is not None:
            src.emit(indent, f"if not {condition}:")
            src.emit(indent + 1, "raise _Decline")


def _nested(src: _Source, field: fields.Nested) -> tuple[str, str]:
    """Names of the nested schema's lane function and schema, bound on first use (a schema may nest itself)."""
    run, schema = src.name("lane"), src.name("schema")
    names = src.names

    def first_use(_schema: Any, value: Any) -> Any:
        lane = FastLane(field.schema, unknown=field.unknown)
        names[run], names[schema] = lane.run, field.schema
        return lane.run(field.schema, value)

    names[run] = first_use
    return run, schema


def _is_nested(field: fields.Field) -> bool:
    return (_plain(field, fields.Nested) and not field.many and field.only is None and not field.exclude
            and isinstance(field.nested, type | Schema))


def _scalar_class(field: fields.Field) -> str | None:
    """'str' or 'int' when the field loads a plain string or a StrictInt (checked by class inline); else None."""
    if _plain(field, fields.String):
        return "str"
    return "int" if type(field) is StrictInt else None


def _loads_plain_dict(field: fields.Field) -> bool:
    """A Dict that keeps its values as they are and, if it has a key field, only wants string keys."""
    if not _plain(field, fields.Dict) or field.value_field is not None:
        return False
    key = field.key_field
    return key is None or (_plain(key, fields.String) and not key.validators)


def _known(field: fields.Field) -> bool:
    """The lane loads the field itself (else the field's own `deserialize` is called)."""
    return (_scalar_class(field) is not None or _is_nested(field) or _plain(field, fields.Raw)
            or _plain(field, fields.List) or _loads_plain_dict(field))


def _decline_unless(src: _Source, indent: int, condition: str) -> None:
    """`if condition: raise _Decline`."""
    src.emit(indent, f"if {condition}:")
    src.emit(indent + 1, "raise _Decline")


def _emit_bounded(src: _Source, field: fields.Field, var: str, indent: int, kind: str,
                  bounds: tuple[Any, Any]) -> None:
    """The usual field, in one step: a string within its lengths, an integer within its range."""
    condition = _within(src, f"len({var})" if kind == "str" else var, *bounds)
    if field.allow_none:
        _decline_unless(src, indent, f"{var}.__class__ is not {kind} and {var} is not None")
        if condition is not None:
            _decline_unless(src, indent, f"{var} is not None and not {condition}")
    else:
        _decline_unless(src, indent, f"{var}.__class__ is not {kind}" + (f" or not {condition}" if condition else ""))


def _emit_none_check(src: _Source, field: fields.Field, var: str, indent: int) -> int:
    """None: skipped when allowed (the indent of what follows is returned), else declined when no class check
    below would."""
    if field.allow_none:
        src.emit(indent, f"if {var} is not None:")
        return indent + 1
    if not (_scalar_class(field) or _plain(field, fields.Dict) or _plain(field, fields.List)):
        _decline_unless(src, indent, f"{var} is None")
    return indent


def _emit_scalar(src: _Source, field: fields.Field, var: str, indent: int) -> None:
    _decline_unless(src, indent, f"{var}.__class__ is not {_scalar_class(field)}")


def _emit_dict(src: _Source, field: fields.Dict, var: str, indent: int) -> None:
    _decline_unless(src, indent, f"{var}.__class__ is not dict")
    if field.key_field is not None:
        _decline_unless(src, indent, f"{var} and {{*map(type, {var})}} != {{str}}")
    src.emit(indent, f"{var} = dict({var})")


def _emit_list(src: _Source, field: fields.List, var: str, indent: int) -> None:
    _decline_unless(src, indent, f"{var}.__class__ is not list")
    inner = field.inner
    if _is_nested(inner) and not inner.allow_none and not inner.validators:
        run, schema = _nested(src, inner)
        src.emit(indent, f"{var} = [{run}({schema}, item) for item in {var}]")
        return
    items, item = src.name("items"), src.name("item")
    src.emit(indent, f"{items} = []")
    src.emit(indent, f"for {item} in {var}:")
    _emit_value(src, inner, item, indent + 1)
    src.emit(indent + 1, f"{items}.append({item})")
    src.emit(indent, f"{var} = {items}")


def _emit_nested(src: _Source, field: fields.Nested, var: str, indent: int) -> None:
    run, schema = _nested(src, field)
    src.emit(indent, f"{var} = {run}({schema}, {var})")


# what a known field's value is checked and turned into, by field kind (the first that matches; a plain Raw
# matches none: only its None check and its rules)
_KIND_EMITTERS: tuple[tuple[Any, Any], ...] = (
    (lambda field: _scalar_class(field) is not None, _emit_scalar),
    (lambda field: isinstance(field, fields.Dict), _emit_dict),
    (lambda field: isinstance(field, fields.List), _emit_list),
    (_is_nested, _emit_nested),
)
_MARSHMALLOW_ONLY = fields.Method | fields.Function | fields.Pluck


def _emit_value(src: _Source, field: fields.Field, var: str, indent: int) -> None:
    """Statements that turn the present value `var` of `field` into what the field loads, or raise _Decline."""
    kind = _scalar_class(field)
    bounds = _bounds(field) if kind else None
    if bounds is not None:
        _emit_bounded(src, field, var, indent, kind, bounds)
        return
    marshmallow_only = isinstance(field, _MARSHMALLOW_ONLY)
    if not marshmallow_only and not _known(field):
        own = src.name("field", field)
        src.emit(indent, f"{var} = {own}.deserialize({var})  # {type(field).__name__}: its own load")
        return
    indent = _emit_none_check(src, field, var, indent)
    if marshmallow_only:
        src.emit(indent, f"raise _Decline  # {type(field).__name__}: marshmallow loads it")
        return
    emit = next((emit for matches, emit in _KIND_EMITTERS if matches(field)), None)
    if emit is not None:
        emit(src, field, var, indent)
    _emit_rules(src, field, var, indent)
    if src.lines[-1].endswith(":"):
        src.emit(indent, "pass")


def _hook(attr: str) -> str:
    return f"schema.{attr}" if attr.isidentifier() else f"getattr(schema, {attr!r})"


def _ordered(hooks: dict, kind: str) -> list[tuple[str, dict]]:
    """(attr, kwargs) of the schema's `kind` hooks in the order marshmallow runs them (collection ones first)."""
    return [(attr, kw) for collection in (True, False) for attr, many, kw in hooks[kind] if many is collection]


def _with_original(hooks: dict, kind: str) -> list[tuple[str, bool]]:
    return [(attr, kw.get("pass_original", False)) for attr, kw in _ordered(hooks, kind)]


class _Description(NamedTuple):
    """What a schema's load does, as the lane needs it (see the comment above `_Decline`)."""

    precheck: bool  # a @clean_json_check pre_load hook: one is_clean_json pass instead
    pre_load: list[tuple[str, bool]]  # (attr, pass_original), the other pre_load hooks
    declared: list[tuple[str, str, fields.Field]]  # (data key, attribute, field)
    validates: list[tuple[str, tuple[str, str]]]  # (attr, (data key, attribute)) of each @validates field
    schema_checks: list[tuple[str, bool]]
    post_load: list[tuple[str, bool]]


def _is_clean_json_check(schema: Schema, attr: str) -> bool:
    return getattr(getattr(schema, attr), "clean_json_check", False)


def _declared(schema: Schema) -> list[tuple[str, str, fields.Field]]:
    declared = []
    for name, field in schema.load_fields.items():
        attr = field.attribute or name
        if "." in attr:
            raise TypeError(f"{type(schema).__name__}.{name}: a dotted attribute")
        declared.append((field.data_key or name, attr, field))
    return declared


def _describe(schema: Schema) -> _Description:
    hooks = schema._hooks
    pre_load = _ordered(hooks, "pre_load")
    by_name = {name: (field.data_key or name, field.attribute or name) for name, field in schema.load_fields.items()}
    return _Description(
        precheck=any(_is_clean_json_check(schema, attr) for attr, _ in pre_load),
        pre_load=[(attr, kw.get("pass_original", False)) for attr, kw in pre_load
                  if not _is_clean_json_check(schema, attr)],
        declared=_declared(schema),
        validates=[(attr, by_name[name]) for attr, _, kw in hooks["validates"] for name in kw["field_names"]
                   if name in by_name],
        schema_checks=_with_original(hooks, "validates_schema"),
        post_load=_with_original(hooks, "post_load"),
    )


def _emit_entry(src: _Source, about: _Description, unknown: str, options: str) -> None:
    """The lane's first statements: the body is a (clean) dict, the pre_load hooks, the unknown-key check."""
    _decline_unless(src, 1, "data.__class__ is not dict" + (" or not is_clean_json(data)" if about.precheck else ""))
    if any(pass_original for _, pass_original in about.pre_load + about.schema_checks + about.post_load):
        src.emit(1, "original = data")
    for attr, pass_original in about.pre_load:
        src.emit(1, f"data = {_hook(attr)}(data, {'original, ' if pass_original else ''}{options})")
        _decline_unless(src, 1, "data.__class__ is not dict")
    if unknown == RAISE:
        keys = src.name("keys", frozenset(key for key, _, _ in about.declared))
        src.emit(1, f"if not data.keys() <= {keys}:  # an unknown key under RAISE")
        src.emit(2, "raise _Decline")


def _emit_field(src: _Source, key: str, attr: str, field: fields.Field) -> None:
    """One declared field: its value loaded when present, else declined (required) or its load_default."""
    src.emit(1, f"if {key!r} in data:")
    src.emit(2, f"value = data[{key!r}]")
    _emit_value(src, field, "value", 2)
    src.emit(2, f"out[{attr!r}] = value")
    default = field.load_default
    if field.required:
        src.emit(1, "else:")
        src.emit(2, "raise _Decline  # required")
    elif default is not missing:
        src.emit(1, "else:")
        src.emit(2, f"out[{attr!r}] = " + (f"{src.name('default', default)}()" if callable(default)
                                           else src.literal(default, "default")))


def _emit_checks(src: _Source, about: _Description, options: str) -> None:
    """The schema's @validates, @validates_schema and @post_load hooks on the loaded `out`."""
    for attr, (key, field_attr) in about.validates:
        src.emit(1, f"if {field_attr!r} in out:")
        src.emit(2, f"{_hook(attr)}(out[{field_attr!r}], data_key={key!r})")
    for attr, pass_original in about.schema_checks:
        src.emit(1, f"{_hook(attr)}(out, {'original, ' if pass_original else ''}{options})")
    for attr, pass_original in about.post_load:
        src.emit(1, f"out = {_hook(attr)}(out, {'original, ' if pass_original else ''}{options})")


def _write_lane(function: str, about: _Description, unknown: str) -> _Source:
    """The text of the lane function `function(schema, data)` for the schema `about` describes."""
    src = _Source()
    options = f"many=False, partial=schema.partial, unknown={unknown!r}"
    src.emit(0, f"def {function}(schema, data):")
    _emit_entry(src, about, unknown, options)
    src.emit(1, "out = {}")
    for key, attr, field in about.declared:
        _emit_field(src, key, attr, field)
    _emit_checks(src, about, options)
    src.emit(1, "return out")
    return src


class FastLane:
    """What `schema.load(data)` returns, derived from the schema (see above) as one generated function
    (`source` is its text; `run(schema, data)` raises _Decline)."""

    def __init__(self, schema: Schema, *, unknown: str | None = None) -> None:
        self.unknown = unknown or schema.unknown
        if self.unknown not in (RAISE, EXCLUDE):
            raise TypeError(f"{type(schema).__name__}: a fast lane keeps unknown=RAISE or EXCLUDE")
        function = f"lane_{type(schema).__name__}"
        src = _write_lane(function, _describe(schema), self.unknown)
        self.source = "\n".join(src.lines) + "\n"
        filename = f"<fast lane {type(schema).__module__}.{type(schema).__qualname__}>"
        exec(compile(self.source, filename, "exec"), src.names)  # noqa: S102 - our own generated text
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)  # tracebacks
        self.run = src.names[function]

    def load(self, schema: Schema, data: Any) -> dict | None:
        """The schema's load of `data`, or None when marshmallow must look at it."""
        try:
            return self.run(schema, data)
        except (_Decline, ValidationError, RecursionError):  # marshmallow decides (and answers) instead
            return None


_LANES: dict[type, FastLane] = {}


class FastLoad(Schema):
    """A request schema whose `load` takes the fast lane derived from it (`FastLane`) and runs
    marshmallow only when the lane declines: the same result, the same errors, a fraction of the cost."""

    @classmethod
    def fast_lane(cls) -> FastLane:
        """The class's lane (built on first use); `print(Schema.fast_lane().source)` shows its code."""
        lane = _LANES.get(cls)
        if lane is None:
            lane = _LANES[cls] = FastLane(cls())
        return lane

    def load(self, data, *, many=None, partial=None, unknown=None):
        if many is None and partial is None:
            lane = _LANES.get(type(self)) or type(self).fast_lane()
            if ((unknown is None or unknown == self.unknown) and not self.many
                    and self.unknown == lane.unknown and self.only is None and not self.exclude and not self.load_only
                    and not self.dump_only and not self.partial):
                found = lane.load(self, data)
                if found is not None:
                    return found
        return super().load(data, many=many, partial=partial, unknown=unknown)
