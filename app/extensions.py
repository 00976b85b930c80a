"""Unbound extensions, bound to the app in `create_app()` in a fixed order."""

from __future__ import annotations

import functools

from apispec import BasePlugin
from celery import Celery
from flask import Blueprint as _FlaskBlueprint
from flask.views import MethodView
from flask_smorest import Api as _Api
from flask_smorest import Blueprint as _Blueprint
from flask_smorest.utils import resolve_schema_instance, set_status_and_headers_in_response, unpack_tuple_response
from marshmallow import RAISE, Schema, fields
from marshmallow.decorators import POST_DUMP, PRE_DUMP
from webargs import core
from webargs.flaskparser import FlaskParser
from werkzeug import Response

from app import idempotency
from app.auth import require
from app.db import db
from app.jsonbody import PreEncoded, loads, require_json_body
from app.reqctx import app_object, current_g, current_request


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
    """`{"success": true}`: the answer of a write that has nothing else to say (an update, a delete)."""

    success = fields.Boolean(required=True, metadata={"example": True})


# the one class a value of each field kind dumps unchanged as (a Dict: marshmallow copies it, same JSON; an
# Integer: not bool, int(True) would dump 1)
_WIRE_CLASS = {fields.String: str, fields.Dict: dict, fields.Boolean: bool, fields.Integer: int, fields.Float: float}


def _converts(field) -> bool:
    """The field's options make marshmallow change the value: a number dumped as a string, a Dict's key or
    value field."""
    return (getattr(field, "as_string", False) or getattr(field, "key_field", None) is not None
            or getattr(field, "value_field", None) is not None)


def _class_check(cls):
    return lambda v: v is None or v.__class__ is cls


def _nested_check(field):
    if not isinstance(field.schema, ExactDumpSchema) or field.many:
        return None
    schema = field.schema
    return lambda v: v is None or schema.dumps_as_is(v)


def _list_check(field):
    inner = _exact_check(field.inner)
    if inner is None:
        return None
    if type(field.inner) is fields.Nested:  # a list of objects (a page's records): the schema's own loop
        schema = field.inner.schema
        return lambda v: v is None or (v.__class__ is list and schema.all_as_is(v, none_ok=True)) \
            or v.__class__ is PreEncoded  # a page's records as one array: its maker vouches for it
    return lambda v: v is None or (v.__class__ is list and all(inner(item) for item in v))


def _exact_check(field):
    """A predicate telling whether marshmallow would dump a value of `field` as that very value (JSON-
    equal), or None when the field kind is not one this shortcut knows (then the schema always dumps)."""
    kind = type(field)
    if kind in _WIRE_CLASS:
        return None if _converts(field) else _class_check(_WIRE_CLASS[kind])
    if kind is fields.Nested:
        return _nested_check(field)
    if kind is fields.List:
        return _list_check(field)
    return None


def _as_is(plan: dict, obj: dict) -> bool:
    """Each value of `obj` passes its key's entry of an `ExactDumpSchema._exact_plan`: of that class (or
    None), or the predicate says so; an undeclared key does not pass."""
    for key, value in obj.items():
        wanted = plan.get(key)
        if wanted is None:
            return False
        if wanted.__class__ is type:
            if value is not None and value.__class__ is not wanted:
                return False
        elif not wanted(value):
            return False
    return True


class ExactDumpSchema(Schema):
    """A response schema whose `dump` returns a dict unchanged when marshmallow would produce the same
    JSON from it: only declared keys, each value already of its field's wire type (str, dict, bool, int,
    float, None; lists and nested schemas checked the same way). Anything else (an unknown key, a
    value marshmallow would convert, a field kind not listed in `_exact_check`) is dumped by
    marshmallow as before, so the answer is the same either way; hot routes skip the per-field work
    (a page of 20 records: ~300 field serialisations). For schemas without dump hooks or
    only/exclude."""

    def _exact_checks(self) -> dict | None:
        checks = self.__dict__.get("_checks", False)
        if checks is False:
            checks = {}
            if self._hooks[PRE_DUMP] or self._hooks[POST_DUMP] or self.only is not None or self.exclude:
                checks = None
            else:
                for name, field in self.dump_fields.items():
                    check = _exact_check(field)
                    if check is None or field.data_key not in (None, name) or field.attribute not in (None, name):
                        checks = None
                        break
                    checks[name] = check
            self.__dict__["_checks"] = checks
        return checks

    def _exact_plan(self) -> dict | None:
        """`_exact_checks` made faster to apply: key → the one class a value must be of (a plain field,
        checked inline: no call per value; a page of 20 records has ~250) or the predicate (the others)."""
        plan = self.__dict__.get("_plan", False)
        if plan is False:
            checks = self._exact_checks()
            if checks is not None:
                plan = {name: _WIRE_CLASS[type(self.dump_fields[name])]
                        if type(self.dump_fields[name]) in _WIRE_CLASS else check  # a `_class_check` (_exact_check)
                        for name, check in checks.items()}
            else:
                plan = None
            self.__dict__["_plan"] = plan
        return plan

    def dumps_as_is(self, obj) -> bool:
        """Whether `dump(obj)` (one object) is JSON-equal to `obj` itself."""
        plan = self._exact_plan()
        if plan is None:
            return False
        if obj.__class__ is not dict:
            return obj.__class__ is PreEncoded  # its maker vouches for it (app.jsonbody.PreEncoded)
        return _as_is(plan, obj)

    def all_as_is(self, items: list, none_ok: bool = False) -> bool:
        """Whether `dump(items, many=True)` is JSON-equal to `items` (`dumps_as_is` of each, one loop);
        `none_ok`: a None item passes (a list field's Nested items: marshmallow dumps None as None)."""
        plan = self._exact_plan()
        if plan is None:
            return False
        for obj in items:
            if obj.__class__ is not dict:
                if (obj is None and none_ok) or obj.__class__ is PreEncoded:
                    continue
                return False
            if not _as_is(plan, obj):
                return False
        return True

    def dump(self, obj, *, many=None):
        many = self.many if many is None else bool(many)
        if many:
            if obj.__class__ is list and self.all_as_is(obj):
                return obj
        elif self.dumps_as_is(obj):
            return obj
        return super().dump(obj, many=many)


class _CrossFieldRules(BasePlugin):
    """Rules that span fields, stated in OpenAPI: a schema class's `OPENAPI_EXTRA` (e.g. `anyOf`
    branches) is merged into its component, so the documented schema says what the code enforces."""

    def schema_helper(self, name, definition, **kwargs):
        schema = kwargs.get("schema")
        extra = getattr(schema if isinstance(schema, type) else type(schema), "OPENAPI_EXTRA", None)
        return dict(extra) if extra else None


def _configured_maximum(config):
    """`metadata={"maximum_setting": NAME}`: the field's documented `maximum` is this app's setting NAME
    (enforced by the code that reads the same setting), not a number written at import — an operator
    who lowers it gets a document that says so. The Api, and so its document, is built per app."""

    def attribute(converter, field, ret) -> dict:
        setting = field.metadata.get("maximum_setting")
        return {"maximum": int(config[setting])} if setting else {}

    return attribute


def _configured_max_bytes(config):
    """`metadata={"maxBytes_setting": NAME}` (app.jsonbody.BoundedJson): the field's byte limit is stated
    as `x-maxBytes` and as a sentence of its description, from this app's setting NAME."""

    def attribute(converter, field, ret) -> dict:
        setting = field.metadata.get("maxBytes_setting")
        if not setting:
            return {}
        limit = int(config[setting])
        note = f"At most {limit} bytes as compact JSON ({setting}; 400 above)."
        description = (ret.get("description") or "").rstrip(". ")
        return {"x-maxBytes": limit, "description": f"{description}. {note}" if description else note}

    return attribute


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

    def register_blueprint(self, blp, *, parameters=None, **options):
        """flask-smorest's, with the document's tag named by the blueprint's `tag` (see Blueprint)."""
        super().register_blueprint(blp, parameters=parameters, **options)
        tag = getattr(blp, "tag", None)
        name = options.get("name", blp.name)
        for entry in self.spec._tags:  # apispec keeps the document's tags here, in registration order
            if tag and entry["name"] == name:
                entry["name"] = tag

    def _init_spec(self, *, extra_plugins=None, **kwargs):
        super()._init_spec(extra_plugins=[*(extra_plugins or ()), _CrossFieldRules()], **kwargs)
        self.ma_plugin.converter.add_attribute_function(_nullable_nested)
        self.ma_plugin.converter.add_attribute_function(_configured_maximum(self._app.config))
        self.ma_plugin.converter.add_attribute_function(_configured_max_bytes(self._app.config))


class SafeParser(FlaskParser):
    """webargs parser whose JSON comes from `app.jsonbody.loads` (depth, digits, NUL, surrogates) and
    that answers 415 for a body of another type where JSON is expected (webargs ignores it)."""

    DEFAULT_VALIDATION_STATUS = 400  # schema failures are 400 VALIDATION_ERROR, not webargs' 422

    def parse(self, argmap, req=None, *, location=None, **kwargs):
        """webargs' parse; an operation that takes no query parameter (NoQueryParameters) and gets none
        costs no schema load (the answer would be `{}`); any parameter sent goes through the schema, which
        refuses it as unknown."""
        if (argmap.__class__ is NoQueryParameters and location == "query"
                and not (req or current_request()).query_string):
            return {}
        return super().parse(argmap, req, location=location, **kwargs)

    def _raw_load_json(self, req):
        if not require_json_body(req):
            return core.missing
        return loads(req.get_data(cache=True))


def in_unit_of_work(view):
    """`view` run as the request's unit of work (`db.unit_of_work()`): its writes commit when it returns
    (the tasks it enqueued are sent then), and roll back when it raises. functools.wraps keeps the
    markers app.auth and the OpenAPI document read (`view_class`, `_required_scopes`, …).

    A request carrying `Idempotency-Key` to an operation marked `@blp.idempotent` runs through
    `app.idempotency.run_idempotent` instead (the same unit of work, its answer stored in it or
    replayed); any other request pays one header lookup for that."""

    plain = _plain_method_view(view)

    @functools.wraps(view)
    def edge(*args, **kwargs):
        if idempotency.wanted(view):
            return idempotency.run_idempotent(view, args, kwargs)
        with db.unit_of_work():
            if plain and not args:
                return _dispatch_method_view(view.view_class, kwargs)
            return view(*args, **kwargs)

    return edge


def _as_view_code():
    class _Probe(MethodView):
        pass

    return _Probe.as_view("probe").__code__


_AS_VIEW_CODE = _as_view_code()


def _plain_method_view(view) -> bool:
    """Whether `view` is what `MethodView.as_view(name)` makes for a class that keeps MethodView's
    `dispatch_request`, makes an instance per request, has no `decorators` and takes no constructor
    arguments: then `_dispatch_method_view` does exactly what it would."""
    cls = getattr(view, "view_class", None)
    if not (isinstance(cls, type) and issubclass(cls, MethodView)) \
            or getattr(view, "__code__", None) is not _AS_VIEW_CODE:
        return False
    if cls.dispatch_request is not MethodView.dispatch_request or not cls.init_every_request or cls.decorators:
        return False
    cells = dict(zip(view.__code__.co_freevars, (c.cell_contents for c in view.__closure__ or ()), strict=True))
    return cells.get("class_args") == () and cells.get("class_kwargs") == {}


def _dispatch_method_view(view_class, kwargs):
    """Flask's `as_view` function and `MethodView.dispatch_request`, with the request and the app read
    once from their context variables (app.reqctx) instead of through the proxies (4 reads: ~30 000
    instructions). `view_class` is read from the view function on every call, as Flask does."""
    req = current_request()
    self = view_class()
    method = req.method
    meth = getattr(self, method.lower(), None)
    if meth is None and method == "HEAD":
        meth = getattr(self, "get", None)
    assert meth is not None, f"Unimplemented method {method!r}"
    return app_object().ensure_sync(meth)(**kwargs)


class _UnitOfWorkAtTheEdge(_FlaskBlueprint):
    """Below flask-smorest's Blueprint in the MRO (see Blueprint): every view function it registers with
    Flask (a MethodView's `as_view` function included) runs in the request's unit of work."""

    def add_url_rule(self, rule, endpoint=None, view_func=None, provide_automatic_options=None, **options):
        if view_func is not None:
            view_func = in_unit_of_work(view_func)
        super().add_url_rule(rule, endpoint, view_func, provide_automatic_options, **options)


class Blueprint(_Blueprint, _UnitOfWorkAtTheEdge):
    """flask-smorest's Blueprint, plus who may call each operation: enforced and documented at once;
    and the unit of work at the edge: every view runs in `db.unit_of_work()` (one commit when it
    returns, a rollback when it raises), so routes and services never commit.

    `@blp.requires(*scopes, roles=..., star_bypasses=..., internal_token=...)` (app.auth.require), the
    one access decorator, enforces; every operation of an API blueprint is documented with the bearer
    security (and the internal token where it is accepted) and a 401, and those with declared scopes
    or roles with a 403, from the markers the decorator leaves on the view.

    Its arguments are parsed by `SafeParser` (schema failures are 400 VALIDATION_ERROR, documented as
    such, not webargs' 422; JSON bodies go through app.jsonbody): set on this class, so flask-smorest's
    own classes are left as they are."""

    ARGUMENTS_PARSER = SafeParser()

    def __init__(self, *args, tag: str | None = None, refuse_unknown_query: bool = True, **kwargs):
        """`tag`: the OpenAPI tag of the blueprint's operations, in sentence case ("Tool definitions",
        "Entity store"): a heading of Swagger UI and of generated clients. The blueprint's name stays what
        it was (the prefix of its Flask endpoints, in url_for and logs), so renaming a heading never
        renames an endpoint. `refuse_unknown_query=False`: its operations without query parameters
        ignore the query string (add_url_rule), for callers that are not API clients (health probes)."""
        super().__init__(*args, **kwargs)
        self.tag = tag
        self.refuse_unknown_query = refuse_unknown_query
        self._prepare_doc_cbks.append(_prepare_http_semantics_doc)

    @staticmethod
    def idempotent(view):
        """The operation accepts `Idempotency-Key` (app.idempotency): a retry with the same key and
        request replays the first answer instead of running again. For POSTs that create or send.
        Documented (the header, `Idempotent-Replayed`, 409 and 422) from the marker it leaves."""
        view._idempotent = True
        return view

    @staticmethod
    def conditional(view):
        """The operation answers `ETag` and honours `If-None-Match` (a read: 304) or `If-Match` (PUT,
        PATCH, DELETE: 412 when stale; a create only answers the ETag); the view does so through
        app.preconditions. This marker documents it."""
        view._conditional = True
        return view

    @staticmethod
    def requires(*scopes: str, roles: tuple[str, ...] = (), star_bypasses: bool = True,
                 internal_token: bool = False):
        return require(*scopes, roles=roles, star_bypasses=star_bypasses, internal_token=internal_token)

    def add_url_rule(self, rule, endpoint=None, view_func=None, provide_automatic_options=None, **options):
        """flask-smorest's, with every operation refusing query parameters it does not declare: one without
        a query `arguments` gets an empty one (NoQueryParameters), so `?x=1` is the same 400 naming `x` as
        an unknown parameter of an operation that takes some (`arguments` below). A MethodView's methods
        are replaced on its class."""
        if self.refuse_unknown_query and isinstance(view_func, type) and issubclass(view_func, MethodView):
            for method in view_func.methods or ():
                function = getattr(view_func, method.lower(), None)
                if function is not None and not _declares_query(function):
                    setattr(view_func, method.lower(), self._no_query_parameters(function))
        elif self.refuse_unknown_query and view_func is not None and not _declares_query(view_func):
            view_func = self._no_query_parameters(view_func)
        super().add_url_rule(rule, endpoint, view_func, provide_automatic_options, **options)

    def response(self, status_code, schema=None, **kwargs):
        """flask-smorest's `response` (the same document, the same answer), whose wrapper reads the app and
        `g` from their context variables (app.reqctx) instead of through three `current_app` / `g` proxy
        reads per request (~8 000 instructions each): the view through `ensure_sync`, a werkzeug Response
        returned as it is, otherwise the schema's dump (left in `g._flask_smorest["result_dump"]`, as
        flask-smorest does) answered by the app's JSON provider (what `jsonify` calls)."""
        schema = resolve_schema_instance(schema)  # one instance for the document and the dumps
        document = super().response(status_code, schema, **kwargs)
        prepare = self._prepare_response_content

        def decorator(func):
            documented = document(func)

            @functools.wraps(func)
            def wrapper(*args, **kw):
                app = app_object()
                result_raw, r_status_code, r_headers = unpack_tuple_response(app.ensure_sync(func)(*args, **kw))
                if isinstance(result_raw, Response):
                    set_status_and_headers_in_response(result_raw, r_status_code, r_headers)
                    return result_raw
                result_dump = result_raw if schema is None else schema.dump(result_raw)
                current_g().setdefault("_flask_smorest", {})["result_dump"] = result_dump
                resp = app.json.response(prepare(result_dump))
                set_status_and_headers_in_response(resp, r_status_code, r_headers)
                if r_status_code is None:
                    resp.status_code = status_code
                return resp

            wrapper._apidoc = documented._apidoc
            return wrapper

        return decorator

    def _no_query_parameters(self, function):
        return self.arguments(NoQueryParameters, location="query", as_kwargs=True)(function)

    def arguments(self, schema, *args, **kwargs):
        """flask-smorest's `arguments`, given one schema instance per route: webargs instantiates a schema
        class on every request (and marshmallow then builds each Nested schema again). Loading keeps
        no state on the schema, so one instance serves every request; OpenAPI names it the same."""
        if isinstance(schema, type):
            schema = schema()
        if kwargs.get("location") == "query":
            _refuse_unknown_query_parameters(schema)
            kwargs.setdefault("unknown", RAISE)
        document = super().arguments(schema, *args, **kwargs)
        # what flask-smorest hands to webargs' use_args: its own keywords are the document's
        use_args = {key: value for key, value in kwargs.items() if key not in _DOCUMENT_ONLY_ARGUMENTS}
        use_args.setdefault("location", "json")  # flask-smorest's default location
        parser = self.ARGUMENTS_PARSER

        def decorator(func):
            """flask-smorest's (the same document, the same webargs parsing around the view), whose
            innermost wrapper reads the app from its context variable instead of the `current_app` proxy
            (~8 000 instructions per request and `arguments`)."""
            documented = document(func)

            @functools.wraps(func)
            def wrapper(*f_args, **f_kwargs):
                return app_object().ensure_sync(func)(*f_args, **f_kwargs)

            wrapper._apidoc = documented.__wrapped__._apidoc
            return parser.use_args(schema, **use_args)(wrapper)

        return decorator

    def _store_endpoint_docs(self, endpoint, obj, parameters, tags, **options):
        if tags is None and self.tag:
            tags = [self.tag]
        super()._store_endpoint_docs(endpoint, obj, parameters, tags, **options)
        view_class = obj if isinstance(obj, type) else None
        for method, doc in self._docs[endpoint].items():
            if method == "parameters":
                continue
            view = getattr(view_class, method, None) if view_class is not None else obj
            _document_access(doc, getattr(view, "_required_scopes", None), getattr(view, "_required_roles", None),
                             bool(getattr(view, "_internal_token", False)))
            _document_limits(doc, getattr(view, "_rate_limit_group", None),
                             getattr(view, "_concurrency_group", None))
            _document_http_semantics(doc, method, bool(getattr(view, "_idempotent", False)),
                                     bool(getattr(view, "_conditional", False)))


# flask-smorest's `arguments` keywords that only document (the others go to webargs' use_args)
_DOCUMENT_ONLY_ARGUMENTS = frozenset({"content_type", "required", "description", "example", "examples"})
UNKNOWN_QUERY_PARAMETER = "Unknown query parameter."


class NoQueryParameters(Schema):
    """The query schema of an operation that declares none (Blueprint.add_url_rule): every parameter
    sent is unknown."""


def _declares_query(function) -> bool:
    arguments = getattr(function, "_apidoc", {}).get("arguments", {}).get("parameters", [])
    return any(argument.get("in") == "query" for argument in arguments)


def _refuse_unknown_query_parameters(schema: Schema) -> None:
    """A query parameter the operation does not declare is a 400 naming it (a typo such as `limt` would
    otherwise be ignored and answer as if it had not been sent); the message lists what it takes."""
    taken = sorted(field.data_key or name for name, field in schema.load_fields.items())
    listed = ", ".join(taken) if taken else "none"
    schema.error_messages = {**schema.error_messages,
                             "unknown": f"{UNKNOWN_QUERY_PARAMETER} This operation takes: {listed}."}


def path_param(name: str, description: str, example: str | None = None) -> dict:
    """The OpenAPI description of a path parameter, for `@blp.route(rule, parameters=[...])`: what the
    value is and where a caller gets it; `example` only for a value a reader can use as is (a name
    that the examples create), never for an id the server makes."""
    doc = {"in": "path", "name": name, "description": description}
    if example is not None:
        doc["example"] = example
    return doc


def _document_access(doc: dict, scopes, roles, internal_token: bool = False) -> None:
    responses = doc.setdefault("response", {}).setdefault("responses", {})
    security = [{"internalToken": []}, {"bearerAuth": []}] if internal_token else [{"bearerAuth": []}]
    if doc.setdefault("manual_doc", {}).setdefault("security", security) == []:
        return  # `@blp.doc(security=[])`: a public operation (no token is read, so never a 401)
    _add_response(responses, 401, "UNAUTHORIZED: missing, invalid or expired token")
    needs = []
    if roles:
        needs.append(f"role {' or '.join(roles)}")
    if scopes:
        needs.append(f"one of the scopes {', '.join(scopes)}")
    if needs:
        _add_response(responses, 403, f"FORBIDDEN: the token lacks {' and '.join(needs)}")


def _document_limits(doc: dict, rate_limit_group: str | None, concurrency_group: str | None = None) -> None:
    """413 and 415 for an operation with a JSON body (MAX_CONTENT_LENGTH, app.jsonbody), 429 for one
    under a per-organization rate limit (app.ratelimit: `rate_limited` / `may_be_rate_limited`) or
    concurrency limit (`concurrency_limited`)."""
    responses = doc.setdefault("response", {}).setdefault("responses", {})
    arguments = doc.get("arguments", {}).get("parameters", [])
    if any(argument.get("in", "json") == "json" for argument in arguments):
        _add_response(responses, 413, "PAYLOAD_TOO_LARGE: the body exceeds MAX_CONTENT_LENGTH")
        _add_response(responses, 415, "INVALID_INPUT: the body is not application/json")
    limits = []
    if rate_limit_group:
        limits.append(f"the organization's `{rate_limit_group}` limit is spent")
    if concurrency_group:
        limits.append(f"the organization has its `{concurrency_group}` concurrency limit in flight")
    if limits:
        _add_response(responses, 429, f"RATE_LIMITED: {', or '.join(limits)}; Retry-After says when to try again")


_IDEMPOTENCY_KEY_PARAMETER = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
    "description": "Makes a retry safe: the same key with the same request (path, query, body bytes) within "
                   "IDEMPOTENCY_TTL_SECONDS (24 h) replays the first answer (status, body, "
                   "`Idempotent-Replayed: true`) without running again. The same key with another request "
                   "is 422 IDEMPOTENCY_KEY_REUSED; while the first request runs, 409 IDEMPOTENCY_KEY_IN_USE "
                   "(Retry-After). A 5xx or 429 answer releases the key. Scoped to the caller and operation."}
_IF_MATCH_PARAMETER = {
    "name": "If-Match", "in": "header", "required": False, "schema": {"type": "string"},
    "description": "The ETag of the version the change is based on (or `*`): a stale one is 412 "
                   "PRECONDITION_FAILED and nothing changes."}
_IF_NONE_MATCH_PARAMETER = {
    "name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"},
    "description": "An ETag the caller holds: 304 Not Modified (no body) while it is current."}
_ETAG_HEADER = {"description": "Strong entity tag of the resource's current version (for If-Match, "
                               "If-None-Match)", "schema": {"type": "string"}}
_REPLAYED_HEADER = {"description": "`true` when the answer is the stored first answer to this Idempotency-Key",
                    "schema": {"type": "string", "enum": ["true"]}}


def _document_http_semantics(doc: dict, method: str, idempotent: bool, conditional: bool) -> None:
    """The headers of `@blp.idempotent` and `@blp.conditional` operations and their answers (412, 304,
    409, 422), from their markers; `_prepare_http_semantics_doc` puts the parameters and response
    headers in the operation."""
    responses = doc.setdefault("response", {}).setdefault("responses", {})
    extra = doc.setdefault("http_semantics", {"parameters": [], "headers": {}})
    if idempotent:
        extra["parameters"].append(_IDEMPOTENCY_KEY_PARAMETER)
        extra["headers"]["Idempotent-Replayed"] = _REPLAYED_HEADER
        _add_response(responses, 409, "IDEMPOTENCY_KEY_IN_USE: a request with this Idempotency-Key is still "
                                      "running (Retry-After); IDEMPOTENCY_ANSWER_NOT_STORED: it ran, but its "
                                      "answer was above IDEMPOTENCY_MAX_ANSWER_BYTES (details: originalStatus, "
                                      "location): look the result up")
        _add_response(responses, 422, "IDEMPOTENCY_KEY_REUSED: this Idempotency-Key was used for another request")
    if conditional:
        if method != "delete":  # a deleted resource has no current version to tag
            extra["headers"]["ETag"] = _ETAG_HEADER
        if method in ("get", "head"):
            extra["parameters"].append(_IF_NONE_MATCH_PARAMETER)
            responses.setdefault(304, [{"description": "Not Modified: If-None-Match names the current ETag",
                                        "headers": {"ETag": _ETAG_HEADER}, "content_type": None}])
        elif method in ("put", "patch", "delete"):
            extra["parameters"].append(_IF_MATCH_PARAMETER)
            _add_response(responses, 412, "PRECONDITION_FAILED: If-Match names a version the resource no "
                                          "longer has")


def _prepare_http_semantics_doc(doc: dict, doc_info: dict, **kwargs) -> dict:
    """flask-smorest prepare-doc callback: header parameters, and response headers on the 2xx answers."""
    extra = doc_info.get("http_semantics")
    if not extra:
        return doc
    doc.setdefault("parameters", []).extend(extra["parameters"])
    for status, response in doc.get("responses", {}).items():
        if str(status).startswith("2") and isinstance(response, dict):
            response.setdefault("headers", {}).update(extra["headers"])
    return doc


def _add_response(responses: dict, status: int, description: str) -> None:
    """Like `alt_response`, unless the view documents that status itself."""
    if status not in responses and str(status) not in responses:
        responses[status] = [{"schema": ErrorEnvelopeSchema(), "description": description, "content_type": None}]


# Every task's base (its app context and unit of work), named here so that a task created before
# init_celery runs (a module that finalizes Celery first) has it too; resolved when the first task is made.
celery_app = Celery("platform_gateway", task_cls="app.tasks:AppContextTask")

__all__ = ["Api", "Blueprint", "SuccessSchema", "celery_app", "db", "path_param"]
