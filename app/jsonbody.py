"""The one place request JSON is parsed (bad input is a 400, never a 500).

Both readers of a request body go through `loads()`: flask-smorest/webargs arguments (the parser in
`app.extensions`) and `request.get_json()` (the app's JSON provider). It refuses, in the envelope:

- a body that is not `application/json` where JSON is expected → 415 (`require_json_body`);
- bytes that are not UTF-8, or not JSON → 400 INVALID_INPUT;
- nesting deeper than `JSON_MAX_DEPTH` (64) → 400 (Python's decoder recurses; 10 000 levels would be a
  RecursionError, and deep documents make every recursive helper downstream a hazard);
- an integer literal over 4 300 digits (Python refuses to convert it) → 400;
- the literals `NaN`, `Infinity` and `-Infinity` (not JSON, RFC 8259 §6, though Python's decoder takes
  them; JSONB and the domains cannot hold them) → 400 INVALID_INPUT naming the literal, for every
  route alike. A number too big for a float (`1e400`) still parses to infinity and is refused by the
  domain that reads it (`check_storable`, the analytics checks, the schemas' `NulFree` base),
  naming the field;
- a character no text column can hold, in any string or key → 400 VALIDATION_ERROR naming each path
  (`details.fields`): a lone surrogate (`"\\ud800"`, unencodable as UTF-8: PostgreSQL, headers and logs
  would fail on it) or a NUL (`"\\u0000"`, which PostgreSQL text and JSONB cannot store). The NUL rule is
  one rule for a whole request (`nul_problem`): the same answer for a NUL in the URL path or a query
  parameter (`refuse_nul_in_url`, run by create_app for every route), so no domain has a check of its own;
- a string longer than `MAX_STRING_CHARS` → 413.

Past parsing, a free-form JSON field is bounded by `BoundedJson`, the one field type for every object
the caller may fill at will (`metadata`, `config`, `defaultConfig`, JSON Schemas…): at most
`JSON_FIELD_MAX_BYTES` (64 KiB), or `JSON_SCHEMA_MAX_BYTES` (256 KiB) for a JSON Schema, measured by
`json_bytes` (compact UTF-8 JSON, the measure of every byte limit on a JSON value). Over the limit:
400 VALIDATION_ERROR naming the field and the setting. Stored rows are small enough that a page of a
list has a computable bound (the agent registry also caps a whole document and pages by bytes).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import uuid
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import orjson
from flask import current_app, has_app_context
from flask.json.provider import DefaultJSONProvider
from marshmallow import ValidationError, fields
from werkzeug.datastructures import ImmutableMultiDict

from app.config import SETTINGS
from app.errors import ApiError, InvalidInput, PayloadTooLarge, ValidationFailed
from app.reqctx import current_request

NUL_MESSAGE = "must not contain the NUL character (U+0000)"
NUL_KEY_MESSAGE = "a key contains the NUL character (U+0000)"

DEFAULT_MAX_DEPTH = 64
# Only a \u escape can produce a lone surrogate (raw surrogates are invalid UTF-8), so the check runs
# only when the text has a surrogate escape; pairs (emoji) are joined by the decoder, and re-encoding
# (C speed) tells whether a lone one is left before the slower walk that names where.
_SUSPICIOUS_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Only the escape `\u0000` can put a NUL into a parsed string (a raw NUL byte is not valid JSON), so
# the walk that names where runs only when the text has it (the six characters typed as text, escaped
# as `\\u0000`, are a false alarm the walk clears).
_NUL_ESCAPE = "\\u0000"
_BAD_CHARS = re.compile("[\ud800-\udfff]")
ORJSON = True  # False: every compact answer is encoded by json.dumps' encoder (A/B)


class _NonFiniteLiteral(Exception):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


def _refuse_constant(literal: str) -> Any:
    raise _NonFiniteLiteral(literal)


# One decoder for every body (json.loads with arguments would build one per call); the C scanner
# calls parse_constant only when it meets NaN/Infinity/-Infinity, so valid JSON pays nothing for it.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


class UnsupportedMediaType(ApiError):
    status, code = 415, "INVALID_INPUT"


def _setting(name: str, default: int) -> int:
    if has_app_context():
        return int(current_app.config.get(name) or default)
    return default


def loads(data: bytes | bytearray | str) -> Any:
    """Parse a request body; ApiError (400/413) for anything the service cannot safely hold."""
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("Request body is not valid UTF-8.") from None
    else:
        text = data
    if text.startswith("\ufeff"):
        text = text[1:]
    max_depth = _setting("JSON_MAX_DEPTH", DEFAULT_MAX_DEPTH)
    try:
        value = _DECODER.decode(text)
    except _NonFiniteLiteral as exc:
        raise InvalidInput(f"Request body is not valid JSON: {exc.literal} is not a JSON number (JSON has "
                           "no NaN or Infinity; send a finite number, or a string).",
                           {"literal": exc.literal, "reason": "non-finite number literal"}) from None
    except RecursionError:
        raise InvalidInput(f"Request body is nested too deeply (at most {max_depth} levels).") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput("Request body is not valid JSON.",
                           {"line": exc.lineno, "column": exc.colno, "reason": exc.msg}) from None
    except ValueError:  # an integer literal over sys.get_int_max_str_digits() (4 300) digits
        raise InvalidInput("Request body has a number that is too long (integer literals may have at "
                           "most 4300 digits).") from None
    max_string = _setting("MAX_STRING_CHARS", 0)
    if text.count("[") + text.count("{") > max_depth:  # fewer brackets than levels: cannot be too deep
        check_depth(value, max_depth)
    scan = (_NUL_ESCAPE in text) or (bool(_SUSPICIOUS_ESCAPE.search(text)) and _has_lone_surrogate(value))
    long_possible = bool(max_string) and len(text) > max_string
    if scan or long_possible:
        check_strings(value, scan_strings=scan, max_string=max_string if long_possible else 0)
    return value


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_depth(value: Any, max_depth: int = DEFAULT_MAX_DEPTH, what: str = "Request body") -> None:
    """InvalidInput when containers nest deeper than `max_depth` (iterative: no recursion)."""
    if value.__class__ is not dict and value.__class__ is not list:
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth >= max_depth:
            raise InvalidInput(f"{what} is nested too deeply (at most {max_depth} levels).")
        for child in (node.values() if node.__class__ is dict else node):
            if child.__class__ is dict or child.__class__ is list:
                stack.append((child, depth + 1))


def check_strings(value: Any, *, scan_strings: bool = True, max_string: int = 0,
                  what: str = "Request body") -> None:
    """Lone surrogates and NUL characters in strings and keys (400 naming the paths) and strings over
    `max_string` characters (413), in a document already known to be shallow enough."""
    problems: dict[str, list[str]] = {}
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack and len(problems) < 20:
        node, path = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if scan_strings and _BAD_CHARS.search(key):
                    problems.setdefault(_printable(path) or "(root)", []).append(
                        "a key contains a lone surrogate (\\ud800-\\udfff)")
                if scan_strings and "\x00" in key:
                    problems.setdefault(_printable(path) or "(root)", []).append(NUL_KEY_MESSAGE)
                stack.append((item, f"{path}.{key}" if path else str(key)))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(node))
        elif isinstance(node, str):
            _check_string(node, path, scan_strings, max_string, problems)
    if problems:
        raise ValidationFailed(f"{what} contains characters that cannot be stored.", {"fields": problems})


def _check_string(value: str, path: str, scan: bool, max_string: int, problems: dict) -> None:
    if max_string and len(value) > max_string:
        raise PayloadTooLarge(f"A string is longer than {max_string} characters.",
                              {"field": _printable(path), "maxChars": max_string})
    if scan and _BAD_CHARS.search(value):
        problems.setdefault(_printable(path) or "(root)", []).append(
            "must not contain a lone surrogate (\\ud800-\\udfff)")
    if scan and "\x00" in value:
        problems.setdefault(_printable(path) or "(root)", []).append(NUL_MESSAGE)


def _printable(path: str) -> str:
    return _BAD_CHARS.sub("?", path).replace("\x00", "?")[:200]


def refuse_nul_in_url() -> None:
    """The NUL rule for the URL (create_app runs it before every route, after authentication and
    authorization: an anonymous caller still gets 401 on /api/v1). Before routing, so an unknown path
    with a NUL is the same 400, and no domain needs a check of its own."""
    req = current_request()
    # no query string: no parameters to look at (and `args`, parsed on first use, is left for later)
    problem = nul_problem(req.path, req.args if req.environ.get("QUERY_STRING") else _NO_ARGS)
    if problem is not None:
        raise problem


_NO_ARGS = ImmutableMultiDict()
NUL_QUERY_MAX_NAMED = 20  # query parameters an answer names at most (as check_strings stops at 20 problems)


def nul_problem(url_path: str, args) -> ValidationFailed | None:
    """The answer to a NUL character in a request's URL path or query string (parameter names and
    values; `args` is a MultiDict), or None: 400 VALIDATION_ERROR naming where, as for a body."""
    if "\x00" in url_path:
        return ValidationFailed("The URL path must not contain the NUL character (%00).",
                                {"fields": {"path": [NUL_MESSAGE]}, "location": "path"})
    problems: dict[str, list[str]] = {}
    for key, values in args.lists():
        if len(problems) >= NUL_QUERY_MAX_NAMED:  # a query of thousands of such parameters: a bounded answer
            break
        if "\x00" in key:
            problems.setdefault(_printable(key), []).append("the parameter name contains the NUL character (U+0000)")
        elif any("\x00" in value for value in values):
            problems.setdefault(_printable(key), []).append(NUL_MESSAGE)
    if problems:
        return ValidationFailed(f"Query parameter {', '.join(sorted(problems))} must not contain the NUL "
                                "character (%00).", {"fields": problems, "location": "query"})
    return None


def json_bytes(value: Any, *, allow_nan: bool = True) -> int:
    """The size of `value` as compact UTF-8 JSON (no spaces, characters as they are): the one measure
    of every byte limit on a JSON value (`allow_nan=False`: ValueError for a non-finite number)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=allow_nan)
    return len(text.encode("utf-8", "surrogatepass"))


def byte_limit(setting: str) -> int:
    """The app's value of a byte-limit setting (its default outside an app)."""
    if has_app_context() and current_app.config.get(setting):
        return int(current_app.config[setting])
    return int(SETTINGS[setting][0])


def size_error(value: Any, setting: str) -> str | None:
    """The message for a JSON value larger than the setting allows, or None."""
    limit = byte_limit(setting)
    size = json_bytes(value)
    if size <= limit:
        return None
    return f"At most {limit} bytes as JSON ({setting}); this value has {size}."


class BoundedJson(fields.Dict):
    """A free-form JSON object of at most `setting` bytes as compact JSON (400 naming the field and
    the limit). The limit is checked before any other validator of the field (a JSON Schema check
    never runs on a 30 MB document), and the OpenAPI document states it (`x-maxBytes`, and a sentence
    in the description: app.extensions)."""

    def __init__(self, setting: str = "JSON_FIELD_MAX_BYTES", **kwargs: Any) -> None:
        kwargs["metadata"] = {**kwargs.get("metadata", {}), "maxBytes_setting": setting}
        super().__init__(**kwargs)
        self.setting = setting

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        problem = size_error(value, self.setting)
        if problem:
            raise ValidationError(problem)
        return value


# orjson for a compact answer (what it writes for a value is what json.dumps writes, but for the cases
# below): datetimes and dataclasses passed to the provider's `default` (Flask's: http_date, asdict), as
# json.dumps does; the keys sorted and the newline appended by orjson itself.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_APPEND_NEWLINE
# the bytes a JSON text holds only inside strings, escaped (PostgreSQL's text of a record too): the check
# that `_ascii_escaped` may run json's string escaper over a whole answer
_DEL = b"\x7f"
_CONTROL = bytes(range(0x20))
_ESCAPED_QUOTE, _ESCAPED_BACKSLASH = '\\"', "\\\\"
_KNOWN_LEAVES = (str, int, type(None), uuid.UUID, decimal.Decimal, datetime.date)


def _ascii_escaped(body: bytes) -> str | None:
    """orjson's answer (UTF-8, a newline at the end) with each character past "~" escaped as json's
    ensure_ascii escapes it (`\\u00e9`, surrogate pairs), or None when it holds a raw control character.
    json's C string escaper runs over the whole text: it escapes those characters, and doubles every
    backslash and quote, which two replaces undo exactly (after the escaper a backslash only starts
    `\\\\`, `\\"` or `\\u`; `\\"` cannot start inside a `\\\\`, as a quote always follows a backslash
    of its own). About what json's encoder costs over a page of dicts (~90 vs ~110 µs), and a page of
    PreEncoded records is not decoded for it; a raw control character (JSON whitespace other than a
    space) would be escaped where it is not in a string."""
    text = body[:-1]
    if len(text.translate(None, _CONTROL)) != len(text):
        return None
    escaped = encode_basestring_ascii(text.decode("utf-8"))
    return escaped[1:-1].replace(_ESCAPED_QUOTE, '"').replace(_ESCAPED_BACKSLASH, "\\") + "\n"


def _may_hold_non_finite(value: Any) -> bool:
    """Whether `value` holds a float NaN or ±Infinity (orjson writes null, json.dumps NaN/Infinity), or
    an object this walk cannot see into (a dataclass, an object with `__html__`...): then json.dumps
    writes the answer. Run only when orjson's text has a `null`; containers are walked, the common
    leaves (str, None, int, bool, PreEncoded: JSON text, no NaN) passed over inline."""
    stack = [[value]]
    push = stack.append
    while stack:
        node = stack.pop()
        for item in node.values() if node.__class__ is dict else node:
            cls = item.__class__
            if cls is str or item is None or cls is int or cls is bool or cls is PreEncoded:
                continue
            if cls is dict or cls is list or cls is tuple:
                push(item)
            elif cls is float:
                if item - item != 0.0:  # nan - nan and inf - inf are nan
                    return True
            elif isinstance(item, float):
                if not math.isfinite(item):
                    return True
            elif isinstance(item, dict):
                push(dict(item))  # a subclass: walked as a dict
            elif isinstance(item, list | tuple):
                push(item)
            elif not isinstance(item, _KNOWN_LEAVES):
                return True
    return False


class PreEncoded:
    """A JSON value already encoded as text (a page's record: app.db.json_compact of what PostgreSQL
    built): written as it is by orjson (a Fragment: not encoded again), decoded for json's encoder. Who
    makes one vouches that its text is what the response schema would dump (ExactDumpSchema takes it
    as is)."""

    __slots__ = ("text",)

    def __init__(self, text: str | bytes) -> None:
        self.text = text

    def value(self) -> Any:
        return json.loads(self.text)


class SafeJSONProvider(DefaultJSONProvider):
    """`request.get_json()` parses through `loads()` as well.

    `response()` (jsonify, flask-smorest's answers) encodes the compact form with orjson (a page of 20
    records: several times faster than json's C encoder), and falls back to json.dumps' encoder (one
    kept per setting: `default`, `ensure_ascii`, `sort_keys`) for whatever orjson refuses or writes
    otherwise: an integer beyond 64 bits, a lone surrogate, a key that is not a string, nesting past
    orjson's 255 levels, a value `default` refuses (the same TypeError), a NaN or ±Infinity (orjson
    writes null; json NaN/Infinity, not JSON but what the app has always sent). With `ensure_ascii`
    (Flask's default) the characters past "~" orjson writes as UTF-8 are escaped as json escapes them
    (`\\uXXXX`): the same bytes as json.dumps but for a float in exponent form with a negative exponent
    (orjson `1e-7`, json `1e-07`; below 1e-4 orjson may write the decimal form `0.00001`, json `1e-05`),
    the same number. UUIDs orjson writes as `str(uuid)`, as Flask's default does. A `PreEncoded` value
    (a page's record, already compact with its keys sorted) orjson writes as its text, json's encoder
    decoded. The indented form (debug, `compact = False`) is
    Flask's."""

    def __init__(self, app) -> None:
        super().__init__(app)
        self._encoders: dict[tuple, json.JSONEncoder] = {}

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s)

    def response(self, *args: Any, **kwargs: Any):
        if (self.compact is None and self._app.debug) or self.compact is False:
            return super().response(*args, **kwargs)
        obj = self._prepare_response_obj(args, kwargs)
        body = self._orjson(obj) if ORJSON else None
        if body is None:
            body = f"{self._stdlib_encoder().encode(obj)}\n"
        return self._app.response_class(body, mimetype=self.mimetype)

    def _orjson(self, obj: Any) -> bytes | str | None:
        """`obj` as compact JSON and a newline by orjson, or None when json.dumps must write it."""
        try:
            body = orjson.dumps(obj, default=self._orjson_default,
                                option=_ORJSON_OPTIONS | orjson.OPT_SORT_KEYS if self.sort_keys else _ORJSON_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError
            return None
        if b"null" in body and _may_hold_non_finite(obj):
            return None
        if self.ensure_ascii and not (body.isascii() and _DEL not in body):
            return _ascii_escaped(body)
        return body

    def _orjson_default(self, o: Any) -> Any:
        if o.__class__ is PreEncoded:
            return orjson.Fragment(o.text)
        return self.default(o)

    def _stdlib_encoder(self) -> json.JSONEncoder:
        key = (self.default, self.ensure_ascii, self.sort_keys)
        encoder = self._encoders.get(key)
        if encoder is None:
            encoder = self._encoders[key] = json.JSONEncoder(
                default=self._decoding_default, ensure_ascii=self.ensure_ascii, sort_keys=self.sort_keys,
                separators=(",", ":"))
        return encoder

    def _decoding_default(self, o: Any) -> Any:
        return o.value() if o.__class__ is PreEncoded else self.default(o)

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        """Flask's `dumps` (the indented debug answer, `app.json.dumps`), a PreEncoded value decoded."""
        kwargs.setdefault("default", self._decoding_default)
        return super().dumps(obj, **kwargs)


def is_json_mimetype(mimetype: str) -> bool:
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def require_json_body(req) -> bool:
    """True when the request carries a JSON body; 415 when it carries a body of another type.
    An empty body, whatever its Content-Type, is "no body" (the schema decides whether that is allowed)."""
    has_body = bool(req.content_length or req.get_data(cache=True))
    if is_json_mimetype(req.mimetype or ""):
        return has_body  # an empty body is "no body" even when labelled JSON (clients send the header on GET)
    if has_body:
        raise UnsupportedMediaType(
            f"Request body must be application/json (got {(req.mimetype or 'no Content-Type')[:100]}).",
            {"contentType": (req.mimetype or "")[:100]})
    return False
