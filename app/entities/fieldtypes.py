"""Definition schemas: platform field types → plain JSON Schema, the field catalog, record validation.

A definition's `schema` is a JSON Schema object whose properties name a platform field type either in
a `fieldType` keyword beside standard keywords (`{"type": "integer", "fieldType": "int"}`) or directly
as `type` (`{"type": "int"}`); a property with only a JSON Schema type is fine too.
`compile_definition_schema` checks all of it and returns a `CompiledSchema`: the plain JSON Schema the
records are validated against and the `FieldCatalog` the filter compiler types its comparisons with.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from jsonschema import FormatChecker
from jsonschema.exceptions import SchemaError

from app.errors import ValidationFailed
from app.jsonschema_safe import check_schema, validator_for

PLATFORM_TYPES = ("string", "stringMultiline", "text", "int", "float", "bool", "date", "datetime", "email",
                  "phone", "url", "dropdown", "multiselect", "lookup", "multilookup", "currency", "file",
                  "image", "json")
JSON_TYPES = {"string": "string", "number": "float", "integer": "int", "boolean": "bool", "object": "json",
              "array": "json"}
TEXT_LIKE = frozenset({"string", "stringMultiline", "text", "email", "phone", "url", "dropdown", "multiselect"})
PROPERTY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# Keywords of ours that are not JSON Schema; stripped from the compiled schema.
PLATFORM_KEYWORDS = ("fieldType", "options", "entity", "label", "placeholder", "helpText", "order", "hidden")
MAX_PROPERTIES = 500
PHONE = r"^\+?[0-9(][0-9 ().\-]{2,30}[0-9]$"
CURRENCY_CODE = r"^[A-Z]{3}$"
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)
_EMAIL = re.compile(r"^[^@\s\"(),:;<>\[\\\]]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")

# Filter kinds: how the query compiler types a field.
KIND_TEXT, KIND_NUMBER, KIND_BOOL, KIND_DATE, KIND_DATETIME = "text", "number", "bool", "date", "datetime"
KIND_ARRAY, KIND_JSON = "array", "json"
KIND_BY_TYPE = {
    "string": KIND_TEXT, "stringMultiline": KIND_TEXT, "text": KIND_TEXT, "email": KIND_TEXT,
    "phone": KIND_TEXT, "url": KIND_TEXT, "dropdown": KIND_TEXT, "lookup": KIND_TEXT,
    "int": KIND_NUMBER, "float": KIND_NUMBER, "currency": KIND_NUMBER, "bool": KIND_BOOL,
    "date": KIND_DATE, "datetime": KIND_DATETIME, "multiselect": KIND_ARRAY, "multilookup": KIND_ARRAY,
    "file": KIND_JSON, "image": KIND_JSON, "json": KIND_JSON,
}


# --- format checks (enforced) ------------------------------------------------------

FORMATS = FormatChecker(formats=())


@FORMATS.checks("email")
def _is_email(value: object) -> bool:
    return not isinstance(value, str) or (len(value) <= 320 and bool(_EMAIL.match(value)))


@FORMATS.checks("date", raises=ValueError)
def _is_date(value: object) -> bool:
    if isinstance(value, str):
        parse_date(value)
    return True


@FORMATS.checks("date-time", raises=ValueError)
def _is_datetime(value: object) -> bool:
    if isinstance(value, str):
        parse_datetime(value)
    return True


@FORMATS.checks("uri")
def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not value or any(c.isspace() for c in value):
        return False
    parts = urlsplit(value)
    return bool(_SCHEME.match(parts.scheme or "")) and bool(parts.netloc or parts.path)


def parse_date(value: str) -> date:
    """A calendar date YYYY-MM-DD; ValueError otherwise."""
    if not _DATE.match(value):
        raise ValueError("expected a date YYYY-MM-DD")
    return date.fromisoformat(value)


def parse_datetime(value: str) -> datetime:
    """An RFC 3339 date-time with an offset (or Z); ValueError otherwise."""
    if not _DATE_TIME.match(value):
        raise ValueError("expected an RFC 3339 date-time with offset, e.g. 2026-11-22T10:00:00Z")
    return datetime.fromisoformat(value.replace("z", "Z").replace("t", "T").replace(" ", "T"))


# --- compiled schema and catalog -----------------------------------------------------------------

@dataclass(frozen=True)
class FieldSpec:
    """One property of a definition schema, as the query compiler and search need it."""

    name: str
    field_type: str
    kind: str
    options: tuple[str, ...] = ()
    entity: str | None = None  # lookup target entity name, when the schema names one

    @property
    def text_like(self) -> bool:
        return self.field_type in TEXT_LIKE


@dataclass(frozen=True)
class FieldCatalog:
    fields: dict[str, FieldSpec] = field(default_factory=dict)

    def get(self, name: str) -> FieldSpec | None:
        return self.fields.get(name)

    def text_fields(self) -> list[str]:
        return [n for n, f in self.fields.items() if f.text_like]

    def lookup_fields(self) -> dict[str, FieldSpec]:
        return {n: f for n, f in self.fields.items() if f.field_type in ("lookup", "multilookup")}


@dataclass(frozen=True)
class CompiledSchema:
    json_schema: dict[str, Any]
    catalog: FieldCatalog
    validator: Any
    quick: Any = None  # QuickCheck, or None when the schema uses keywords it does not cover

    def is_valid(self, fields: Any) -> bool:
        """Whether `fields` validates; the quick check answers the common case, jsonschema the rest."""
        if self.quick is not None:
            verdict = self.quick(fields)
            if verdict is not None:
                return verdict
        return self.validator.is_valid(fields)

    def errors_for(self, fields: Any) -> dict[str, list[str]]:
        """Every violation of `fields`, keyed by a dotted path starting at `fields`."""
        out: dict[str, list[str]] = {}
        for error in self.validator.iter_errors(fields):
            path = ".".join(["fields", *(str(p) for p in error.absolute_path)])
            out.setdefault(path, []).append(_message(error))
        return out


def _message(error) -> str:
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"unknown field(s): {', '.join(extra)}" if extra else error.message
    if error.validator == "format":
        return f"{error.instance!r} is not a valid {error.validator_value}"
    if error.validator in ("oneOf", "anyOf") and error.context:
        return f"{error.instance!r} is not valid here: {error.context[0].message}"
    return error.message


def compile_definition_schema(schema: Any) -> CompiledSchema:
    """Check a definition schema and compile it; ValidationFailed names the offending property."""
    if not isinstance(schema, dict):
        raise _schema_error("schema", "must be a JSON Schema object")
    return _compile_cached(_freeze(schema))


@lru_cache(maxsize=512)
def _compile_cached(frozen: str) -> CompiledSchema:
    schema = json.loads(frozen)
    errors: dict[str, list[str]] = {}
    if schema.get("type", "object") != "object":
        errors["schema.type"] = ["a definition schema must be of type object"]
    props = _properties_of(schema)
    required = _required_of(schema, props, errors)
    compiled_props, catalog = _compile_properties(props, required, errors)
    if errors:
        raise ValidationFailed("Invalid definition schema.", {"fields": errors})
    out = {k: v for k, v in schema.items() if k not in ("properties", "required", "$schema", "$id")}
    out.update({"type": "object", "properties": compiled_props,
                "additionalProperties": schema.get("additionalProperties", False)})
    if required:
        out["required"] = required
    try:
        check_schema(out)
    except SchemaError as exc:
        path = ".".join(str(p) for p in exc.absolute_path)
        raise _schema_error(f"schema.{path}" if path else "schema", exc.message) from None
    validator = validator_for(out, format_checker_base=FORMATS)
    return CompiledSchema(out, FieldCatalog(catalog), validator, QuickCheck.build(out))


def _properties_of(schema: dict) -> dict:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise _schema_error("schema.properties", "must be an object")
    if len(props) > MAX_PROPERTIES:
        raise _schema_error("schema.properties", f"at most {MAX_PROPERTIES} properties")
    return props


def _required_of(schema: dict, props: dict, errors: dict[str, list[str]]) -> list:
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        errors["schema.required"] = ["must be a list of property names"]
        return []
    for name in required:
        if name not in props:
            errors.setdefault("schema.required", []).append(f"'{name}' is not a property")
    return required


def _compile_properties(props: dict, required: list,
                        errors: dict[str, list[str]]) -> tuple[dict[str, Any], dict[str, FieldSpec]]:
    compiled_props: dict[str, Any] = {}
    catalog: dict[str, FieldSpec] = {}
    for name, prop in props.items():
        where = f"schema.properties.{name}"
        if not PROPERTY_NAME.match(name):
            errors.setdefault(where, []).append("property names must be snake_case "
                                                "(a-z, 0-9, _; starting with a letter; at most 63)")
            continue
        try:
            compiled, spec = _compile_property(name, prop, nullable=name not in required)
        except ValueError as exc:
            errors.setdefault(where, []).append(str(exc))
            continue
        compiled_props[name] = compiled
        catalog[name] = spec
    return compiled_props, catalog


# --- quick validation (bulk speed) ----------------------------------------------------------------
# jsonschema walks every keyword through generic machinery (~40 µs per field). The compiled schemas
# are mostly simple (`type`, `enum`, `format`, bounds), so those properties get a direct predicate.
# A quick "valid" is only given when certain; anything else goes to the full validator, which also
# produces every error message. So the two can never disagree about what is rejected.

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
_ANNOTATIONS = {"description", "title", "default", "examples", "$comment", "readOnly", "writeOnly", "deprecated"}
_ROOT_KEYS = {"type", "properties", "required", "additionalProperties", *_ANNOTATIONS}


def _predicate(schema: Any):
    """A function value → bool that is exactly the schema's verdict, or None when not covered."""
    if not isinstance(schema, dict):
        return None
    checks = []
    for key, arg in schema.items():
        if key in _ANNOTATIONS:
            continue
        check = _keyword_check(key, arg, schema)
        if check is None:
            return None
        checks.append(check)
    return _every(checks)


def _keyword_check(key: str, arg: Any, schema: dict):
    """The check of one keyword of `schema`, or None when it is not covered."""
    build = _KEYWORD_CHECKS.get(key)
    return build(arg, key, schema) if build is not None else None


def _type_check(arg: Any, _key: str, _schema: dict):
    kinds = [arg] if isinstance(arg, str) else arg
    if not isinstance(kinds, list) or not all(k in _TYPE_CHECKS for k in kinds):
        return None
    return _any_of([_TYPE_CHECKS[k] for k in kinds])


def _enum_check(arg: Any, _key: str, _schema: dict):
    if not (isinstance(arg, list) and all(a is None or isinstance(a, str) for a in arg)):
        return None
    allowed = frozenset(arg)
    return lambda v: (v is None or isinstance(v, str)) and v in allowed


def _format_keyword(arg: Any, _key: str, _schema: dict):
    return _format_check(arg) if isinstance(arg, str) else None


def _length_check(arg: Any, key: str, _schema: dict):
    if not isinstance(arg, int):
        return None
    if key == "minLength":
        return lambda v: not isinstance(v, str) or len(v) >= arg
    return lambda v: not isinstance(v, str) or len(v) <= arg


def _bound_check(arg: Any, key: str, _schema: dict):
    if not isinstance(arg, int | float) or isinstance(arg, bool):
        return None
    number = _TYPE_CHECKS["number"]
    if key == "minimum":
        return lambda v: not number(v) or v >= arg
    return lambda v: not number(v) or v <= arg


def _items_check(arg: Any, _key: str, _schema: dict):
    inner = _predicate(arg)
    if inner is None:
        return None
    return lambda v: not isinstance(v, list) or all(inner(i) for i in v)


def _unique_check(arg: Any, _key: str, schema: dict):
    # only where `items` admits strings alone: jsonschema's uniqueness of other values (1 and True
    # distinct, 1 and 1.0 equal, objects by content) is not this set's
    if arg is not True or not _string_items(schema):
        return None
    return lambda v: not isinstance(v, list) or (all(isinstance(i, str) for i in v) and len(set(v)) == len(v))


# keyword → (its argument, the keyword, the whole schema) → check, or None when not covered
_KEYWORD_CHECKS = {
    "type": _type_check, "enum": _enum_check, "format": _format_keyword, "minLength": _length_check,
    "maxLength": _length_check, "minimum": _bound_check, "maximum": _bound_check, "items": _items_check,
    "uniqueItems": _unique_check,
}


def _string_items(schema: dict) -> bool:
    items = schema.get("items")
    return isinstance(items, dict) and items.get("type") in ("string", ["string"])


def _every(checks: list) -> Any:
    """`lambda v: all(c(v) for c in checks)`, without a generator per value (the bulk path runs it per
    field of every record): the lone check itself, or a loop."""
    if len(checks) == 1:
        return checks[0]

    def every(v: Any) -> bool:
        for check in checks:
            if not check(v):
                return False
        return True
    return every


def _any_of(funcs: list) -> Any:
    """`lambda v: any(f(v) for f in funcs)` (a `type` list, mostly `[kind, "null"]`), unrolled."""
    if len(funcs) == 1:
        return funcs[0]
    if len(funcs) == 2:
        first, second = funcs
        return lambda v: first(v) or second(v)
    return lambda v: any(f(v) for f in funcs)


def _format_check(fmt: str) -> Any:
    """`FORMATS.conforms(v, fmt)` with the checker looked up once: a format without a checker passes,
    the checker's own exception (`raises`) or a falsy answer fails, anything else propagates."""
    if fmt not in FORMATS.checkers:
        return lambda v: True
    func, raises = FORMATS.checkers[fmt]

    def conforms(v: Any) -> bool:
        try:
            return bool(func(v))
        except raises:
            return False
    return conforms


def _subvalidator(schema: Any):
    """The full validator of one property's schema (when it has no references to resolve)."""
    if "$ref" in json.dumps(schema) or "$dynamicRef" in json.dumps(schema):
        return None
    return validator_for(schema, format_checker_base=FORMATS).is_valid


class QuickCheck:
    def __init__(self, required: frozenset[str], closed: bool, predicates: dict[str, Any]):
        self.required, self.closed, self.predicates = required, closed, predicates

    @classmethod
    def build(cls, schema: dict) -> QuickCheck | None:
        if set(schema) - _ROOT_KEYS or schema.get("additionalProperties") not in (False, True, None):
            return None
        properties = schema.get("properties", {})
        predicates = {name: _predicate(sub) or _subvalidator(sub) for name, sub in properties.items()}
        return cls(frozenset(schema.get("required", ())), schema.get("additionalProperties") is False, predicates)

    def __call__(self, fields: Any) -> bool | None:
        """True/False when certain; None when a property needs the full validator."""
        if not isinstance(fields, dict) or not self.required.issubset(fields):
            return False
        for name, value in fields.items():
            predicate = self.predicates.get(name, False)
            if predicate is False:
                if self.closed:
                    return False
                continue
            if predicate is None:
                return None
            if not predicate(value):
                return False
        return True


def _freeze(schema: dict) -> str:
    try:
        return json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        raise _schema_error("schema", "must be plain JSON") from None


def _schema_error(path: str, message: str) -> ValidationFailed:
    return ValidationFailed("Invalid definition schema.", {"fields": {path: [message]}})


def _field_type_of(prop: dict) -> str:
    declared = prop.get("fieldType")
    if declared is not None:
        if declared not in PLATFORM_TYPES:
            raise ValueError(f"unknown fieldType '{declared}'; allowed: {', '.join(PLATFORM_TYPES)}")
        return declared
    json_type = _json_type_of(prop)
    if json_type is None:
        if "enum" in prop:
            return "dropdown"
        raise ValueError("needs a type or fieldType")
    if json_type == "string" and prop.get("format") in _STRING_FORMATS:
        return _STRING_FORMATS[prop["format"]]
    if json_type in PLATFORM_TYPES:
        return json_type
    if json_type in JSON_TYPES:
        if json_type == "array" and _is_string_array(prop) and "enum" in prop["items"]:
            return "multiselect"
        return JSON_TYPES[json_type]
    raise ValueError(f"unknown type '{json_type}'; allowed: {', '.join(PLATFORM_TYPES)} or a JSON Schema type")


_STRING_FORMATS = {"date": "date", "date-time": "datetime", "email": "email", "uri": "url"}


def _json_type_of(prop: dict) -> str | None:
    """The property's one JSON type (of a union with null: the other), or None when it has none."""
    json_type = prop.get("type")
    if isinstance(json_type, list):
        non_null = [t for t in json_type if t != "null"]
        json_type = non_null[0] if len(non_null) == 1 else None
        if json_type is None:
            raise ValueError("a union type needs a fieldType")
    if json_type is not None and not isinstance(json_type, str):
        raise ValueError("`type` must be a string (or a list of strings)")
    return json_type


def _is_string_array(prop: dict) -> bool:
    items = prop.get("items")
    return isinstance(items, dict) and items.get("type") == "string" and "format" not in items


def _options(prop: dict) -> list[str]:
    raw = prop.get("options", prop.get("enum"))
    if raw is None and isinstance(prop.get("items"), dict):
        raw = prop["items"].get("enum")
    if not isinstance(raw, list) or not raw:
        raise ValueError("needs a non-empty `options` list")
    values: list[str] = []
    for opt in raw:
        value = opt.get("value") if isinstance(opt, dict) else opt
        if not isinstance(value, str) or not value:
            raise ValueError("each option must be a non-empty string or {value, label}")
        values.append(value)
    if len(set(values)) != len(values):
        raise ValueError("options must be unique")
    return values


def _compile_property(name: str, prop: Any, *, nullable: bool) -> tuple[dict, FieldSpec]:
    if not isinstance(prop, dict):
        raise ValueError("must be an object")
    ftype = _field_type_of(prop)
    keep = {k: copy.deepcopy(v) for k, v in prop.items() if k not in PLATFORM_KEYWORDS and k != "type"}
    entity = _lookup_entity(prop, ftype)
    options: tuple[str, ...] = ()
    if ftype in ("dropdown", "multiselect"):
        options = tuple(_options(prop))
        keep.pop("enum", None)
        keep.pop("items", None)
    compiled = _base_schema(ftype, options)
    for key, value in keep.items():
        compiled.setdefault(key, value)
    if nullable:
        compiled = {"anyOf": [{"type": "null"}, compiled]} if "anyOf" in compiled or "oneOf" in compiled \
            else _allow_null(compiled)
    if ftype == "json" and prop.get("type") in ("object", "array"):
        compiled = _allow_null(dict(compiled, type=prop["type"])) if nullable else dict(compiled, type=prop["type"])
    return compiled, FieldSpec(name, ftype, _kind_of(ftype, prop), options, entity)


def _lookup_entity(prop: dict, ftype: str) -> str | None:
    entity = prop.get("entity")
    if entity is not None and (not isinstance(entity, str) or ftype not in ("lookup", "multilookup")):
        raise ValueError("`entity` (a lookup's target entity name) is allowed on lookup fields only")
    return entity


def _kind_of(ftype: str, prop: dict) -> str:
    """How filters type the field: a plain list of strings filters like a multiselect."""
    return KIND_ARRAY if ftype == "json" and prop.get("type") == "array" and _is_string_array(prop) \
        else KIND_BY_TYPE[ftype]


def _allow_null(schema: dict) -> dict:
    kind = schema.get("type")
    if kind is None:
        return schema
    schema = dict(schema)
    schema["type"] = [kind, "null"] if isinstance(kind, str) else [*kind, "null"]
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _base_schema(ftype: str, options: tuple[str, ...]) -> dict:
    url_string = {"type": "string", "format": "uri", "maxLength": 4096}
    return {
        "string": lambda: {"type": "string"},
        "stringMultiline": lambda: {"type": "string"},
        "text": lambda: {"type": "string"},
        "int": lambda: {"type": "integer"},
        "float": lambda: {"type": "number"},
        "bool": lambda: {"type": "boolean"},
        "date": lambda: {"type": "string", "format": "date"},
        "datetime": lambda: {"type": "string", "format": "date-time"},
        "email": lambda: {"type": "string", "format": "email"},
        "phone": lambda: {"type": "string", "pattern": PHONE},
        "url": lambda: {"type": "string", "format": "uri", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\\s]+"},
        "dropdown": lambda: {"type": "string", "enum": list(options)},
        "multiselect": lambda: {"type": "array", "items": {"type": "string", "enum": list(options)},
                                "uniqueItems": True},
        "lookup": lambda: {"type": "string", "minLength": 1, "maxLength": 64},
        "multilookup": lambda: {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 64},
                                "uniqueItems": True},
        "currency": lambda: {"oneOf": [
            {"type": "number"},
            {"type": "object", "required": ["amount"], "additionalProperties": False,
             "properties": {"amount": {"type": "number"}, "currency": {"type": "string", "pattern": CURRENCY_CODE}}},
        ]},
        "file": lambda: {"oneOf": [url_string, _file_object(url_string)]},
        "image": lambda: {"oneOf": [url_string, _file_object(url_string)]},
        "json": lambda: {},
    }[ftype]()


def _file_object(url_string: dict) -> dict:
    return {"type": "object", "required": ["url"], "properties": {
        "url": url_string, "name": {"type": "string"}, "mimeType": {"type": "string"},
        "size": {"type": "integer", "minimum": 0}}}


def search_document(name: str, fields: dict[str, Any], catalog: FieldCatalog) -> str:
    """The text the stored tsvector is built from: the record name and its text-like field values."""
    parts = [name or ""]
    for fname in catalog.text_fields():
        value = fields.get(fname)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(v for v in value if isinstance(v, str))
    return " ".join(p for p in parts if p)
