"""Application factory. Nothing happens at import time; `create_app()` binds everything.

The functions below import the framework and the domains when they run, not at module level: this
package runs first on every `import app.<anything>`, and the processes that need only a little of it
(the worker health check app.celery_probe, `flask token mint`'s app.token_cli) must not load every
domain, flask-smorest and the database models with it.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
import re
import sys
from inspect import iscoroutinefunction
from itertools import chain
from types import FunctionType, MethodType
from typing import Any

from flask import Flask, current_app
from flask.app import _sentinel
from flask.globals import _cv_request
from flask.signals import request_tearing_down
from werkzeug.routing import MapAdapter
from werkzeug.wsgi import get_host

from app.config import load_config
from app.errors import error_response
from app.reqctx import app_object, current_g, current_request

log = logging.getLogger(__name__)
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

API_INFO = {
    "API_TITLE": "Platform Gateway API",
    "API_VERSION": "v1",
    "OPENAPI_VERSION": "3.0.3",
    "OPENAPI_URL_PREFIX": "/api/v1",
    "OPENAPI_JSON_PATH": "openapi.json",
    "OPENAPI_SWAGGER_UI_PATH": "docs",
    # Served by app/console from the flask-swagger-ui wheel; app/templates/swagger_ui.html replaces
    # flask-smorest's page (whose inline script a Content-Security-Policy would block).
    "OPENAPI_SWAGGER_UI_URL": "/api/v1/docs/assets/",
    "API_SPEC_OPTIONS": {
        "components": {"securitySchemes": {
            "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            "internalToken": {"type": "apiKey", "in": "header", "name": "X-Internal-Token"}}},
        "security": [{"bearerAuth": []}],
        "info": {"description": "Multi-tenant AI platform API. Every call carries a Bearer JWT "
                                "(HS256) whose claims select the organization and product.\n\n"
                                "Rules that hold for every request beyond the schemas below: text anywhere in "
                                "a request (values and object keys) must not contain the NUL character "
                                "(U+0000), which PostgreSQL cannot store (400 VALIDATION_ERROR naming where, "
                                "in the body, the query string or the path). Fields documented as JSON "
                                "Schemas must be valid JSON Schemas, and a `config` must validate against its "
                                "`configSchema` (400). References must exist in the caller's organization: "
                                "`subAgentIds`, entity names, record ids, the fields a filter, sort or "
                                "aggregate names (400 or 404)."},
    },
}


BOUND_HOSTS_CACHE_SIZE = 256
SYNC_FUNCTIONS_CACHE_SIZE = 4096  # closures made per request would otherwise pile up


def _wsgi_text(value: str) -> str:
    """werkzeug's `_wsgi_decoding_dance` (a WSGI string's latin-1 bytes read as UTF-8); ASCII as it is."""
    return value if value.isascii() else value.encode("latin1").decode(errors="replace")


class GatewayFlask(Flask):
    """Flask, whose `ensure_sync` remembers its answer per function body: Flask asks
    `inspect.iscoroutinefunction` of the view and of every request hook (15 of them) on every request.
    A plain function already answered is found by itself first (one set lookup; a function later
    marked as a coroutine function by hand keeps its first answer).
    The answer depends only on the code object's flags (a plain function, or a bound method's
    function): it is remembered per code object, which the closures made from one `def` share, so
    the cache holds one entry per function written in the code, not per request. Anything else (a
    partial, a callable object, a function marked as a coroutine function by hand) is asked as
    Flask asks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._coroutine_code: dict[Any, bool] = {}
        self._bound_hosts: dict[tuple, tuple[str, str]] = {}
        self._sync_functions: dict[FunctionType, None] = {}  # plain functions ensure_sync returns as they are

    def create_url_adapter(self, request):
        """Flask's (3.1), with what it derives from the request's host remembered per host: Flask
        validates the host (`get_host`) and werkzeug's `bind_to_environ` derives it again, lower-cases
        it, splits off the port and IDNA-encodes the name, on every request, for the same few `Host`
        values. The host (`request.host`) and the server name the adapter is bound to are pure functions
        of the scheme, the Host header and the server's address, remembered per those (bounded); the
        adapter is the one `bind_to_environ` builds (path, query string and method of this request).
        Only for the configuration this service runs (no TRUSTED_HOSTS, SERVER_NAME, host or subdomain
        matching, no websocket upgrade); otherwise, and for a host werkzeug refuses, Flask's own."""
        if (request is None or request.trusted_hosts is not None or self.url_map.host_matching
                or self.subdomain_matching or self.config["TRUSTED_HOSTS"] is not None
                or self.config["SERVER_NAME"] is not None):
            return super().create_url_adapter(request)
        env = request.environ
        if "HTTP_UPGRADE" in env:  # a websocket upgrade changes the adapter's scheme: werkzeug decides
            return super().create_url_adapter(request)
        scheme = env["wsgi.url_scheme"]
        key = (scheme, env.get("HTTP_HOST"), env.get("SERVER_NAME"), env.get("SERVER_PORT"))
        known = self._bound_hosts.get(key)
        if known is None:
            host = get_host(env)
            name, port_sep, port = host.lower().partition(":")  # Map.bind's steps
            try:
                name = name.encode("idna").decode("ascii")
            except UnicodeError:
                return super().create_url_adapter(request)  # BadHost, as werkzeug raises it
            if len(self._bound_hosts) >= BOUND_HOSTS_CACHE_SIZE:
                self._bound_hosts.clear()
            known = self._bound_hosts[key] = (host, f"{name}{port_sep}{port}")
        request.host = known[0]
        script_name = env.get("SCRIPT_NAME")
        path_info = env.get("PATH_INFO")
        query_args = env.get("QUERY_STRING")
        return MapAdapter(self.url_map, known[1], "/" if script_name is None else _wsgi_text(script_name),
                          self.url_map.default_subdomain or "", scheme,
                          "/" if path_info is None else _wsgi_text(path_info), env["REQUEST_METHOD"],
                          None if query_args is None else _wsgi_text(query_args))

    def ensure_sync(self, func):
        if func.__class__ is FunctionType and func in self._sync_functions:
            return func  # a plain function answered before (the request hooks: 16 calls per request)
        target = func.__func__ if func.__class__ is MethodType else func
        if target.__class__ is not FunctionType or "_is_coroutine_marker" in target.__dict__:
            return super().ensure_sync(func)
        code = target.__code__
        is_async = self._coroutine_code.get(code)
        if is_async is None:
            is_async = self._coroutine_code[code] = iscoroutinefunction(func)
        if is_async:
            return self.async_to_sync(func)
        if func is target:
            if len(self._sync_functions) >= SYNC_FUNCTIONS_CACHE_SIZE:
                self._sync_functions.clear()
            self._sync_functions[func] = None
        return func

    # Flask's own request-time methods (Flask 3.1), with the current request read once from its context
    # variable (app.reqctx) instead of through the `request` / `request_ctx` proxies (about 8 000
    # instructions per attribute read); otherwise line for line Flask's.

    def dispatch_request(self):
        req = current_request()
        if req.routing_exception is not None:
            self.raise_routing_exception(req)
        rule = req.url_rule
        if getattr(rule, "provide_automatic_options", False) and req.method == "OPTIONS":
            return self.make_default_options_response()
        view_args = req.view_args
        return self.ensure_sync(self.view_functions[rule.endpoint])(**view_args)

    def preprocess_request(self):
        req = current_request()
        names = (None, *reversed(req.blueprints))
        for name in names:
            if name in self.url_value_preprocessors:
                for url_func in self.url_value_preprocessors[name]:
                    url_func(req.endpoint, req.view_args)
        for name in names:
            if name in self.before_request_funcs:
                for before_func in self.before_request_funcs[name]:
                    rv = self.ensure_sync(before_func)()
                    if rv is not None:
                        return rv
        return None

    def process_response(self, response):
        ctx = _cv_request.get(None)
        if ctx is None:
            return super().process_response(response)  # outside a request: as Flask answers
        for func in ctx._after_request_functions:
            response = self.ensure_sync(func)(response)
        for name in chain(ctx.request.blueprints, (None,)):
            if name in self.after_request_funcs:
                for func in reversed(self.after_request_funcs[name]):
                    response = self.ensure_sync(func)(response)
        if not self.session_interface.is_null_session(ctx._session):
            self.session_interface.save_session(self, ctx._session, response)
        return response

    def do_teardown_request(self, exc=_sentinel):
        if exc is _sentinel:
            exc = sys.exc_info()[1]
        for name in chain(current_request().blueprints, (None,)):
            if name in self.teardown_request_funcs:
                for func in reversed(self.teardown_request_funcs[name]):
                    self.ensure_sync(func)(exc)
        request_tearing_down.send(self, _async_wrapper=self.ensure_sync, exc=exc)


def create_app(overrides: dict[str, Any] | None = None) -> Flask:
    """Build the Flask app. `overrides` replace configuration values (tests)."""
    app = GatewayFlask(__name__)
    # here, not at module level: see the module docstring
    from app.jsonbody import SafeJSONProvider, refuse_nul_in_url

    app.json = SafeJSONProvider(app)  # request.get_json() parses through app.jsonbody.loads
    # a copy per app: apispec's to_dict() merges each document into API_SPEC_OPTIONS in place, so a shared
    # dict made every later app serve the first app's values (e.g. another ENTITY_MAX_PAGE_SIZE)
    app.config.update(copy.deepcopy(API_INFO))
    app.config.update(load_config(overrides))
    from app.observability import logs, tracing

    logs.configure(app)  # LOG_FORMAT: plain lines or one JSON object per line
    # a server span per request when this process traces (OTEL_TRACES_EXPORTER); first, so that the span
    # covers every request hook (a 401 of authentication included)
    tracing.instrument_app(app)

    from app.auth import authenticate_request, authorize_request, load_secret
    from app.errors import register_error_handlers
    from app.extensions import Api, celery_app, db
    from app.registry import init_registry
    from app.tasks import init_celery

    # 1. secrets first: a weak or missing secret stops start-up before anything listens
    app.config["JWT_SECRET"] = load_secret(app)
    # 2. database (embedded PostgreSQL when DATABASE_URL is unset); the lazily built services
    db.init_app(app)
    init_registry(app, service_factories())
    # 3. Celery (eager without REDIS_URL): the task modules celeryconfig.include declares; the worker's
    #    lease reapers; per-organization rate limits
    init_celery(celery_app, app)
    _connect_task_signals()
    from app.observability import metrics

    app.extensions["lease_reapers"] = lease_reapers()
    # metrics before every other request hook: the duration covers the whole pipeline, the status is the
    # one sent (its after_request runs last); the deployment's gauges are read at scrape time
    metrics.init_app(app, metric_sources(app.config),
                     [name for name in celery_app.tasks if not name.startswith("celery.")])
    from app import ratelimit

    ratelimit.init_app(app)
    ratelimit.init_concurrency(app)
    # 4. API + OpenAPI, then our envelope handlers over flask-smorest's
    api = Api(app)  # one Api per app: its OpenAPI document belongs to this app
    _register_blueprints(api, app)
    register_error_handlers(app)
    # 5. cross-domain hooks, per app (nothing is installed by importing a module)
    _install_hooks(app)
    # 6. request pipeline: request id, authentication, authorization, the NUL rule (path, query), CORS
    app.before_request(_assign_request_id)
    app.before_request(authenticate_request)
    app.before_request(authorize_request)
    app.before_request(refuse_nul_in_url)  # app.jsonbody: the one NUL rule, here for the path and query
    app.after_request(_finish_response)
    _register_cli(app)
    return app


# The domains, in a fixed order (the order of the OpenAPI document). Each is a package `app/<name>/`
# whose `routes` module exports `blp` or `blueprints` (flask-smorest) and optionally `plain_blueprints`;
# a missing module is an error.
DOMAINS = ("ops", "entities", "agents", "images", "email", "storage", "analytics", "console")


def _register_blueprints(api, app: Flask) -> None:
    for module in _domain_route_modules():
        for blp in getattr(module, "blueprints", [getattr(module, "blp", None)]):
            if blp is not None:
                api.register_blueprint(blp)
        for plain in getattr(module, "plain_blueprints", []):
            app.register_blueprint(plain)


def _domain_route_modules():
    """Each domain's routes module, in DOMAINS order (an ImportError stops start-up)."""
    return [importlib.import_module(f"app.{name}.routes") for name in DOMAINS]


def service_factories() -> dict:
    """Every lazily built singleton of an app (app.registry): name → factory(config, *key)."""
    from app.analytics.tasks import build_redis_client
    from app.email.senders import build_sender
    from app.embeddings import build_embedder_service, build_query_cache_service
    from app.images.providers import build_provider
    from app.images.services import build_fetcher
    from app.storage import build_blob_store

    return {"blob_store": build_blob_store, "image_fetcher": build_fetcher, "image_provider": build_provider,
            "email_sender": build_sender, "embedder": build_embedder_service, "query_cache": build_query_cache_service,
            "analytics_redis": build_redis_client}


def lease_reapers() -> list:
    """Functions the worker's maintenance loop runs (app.tasks.run_maintenance): each re-queues the
    jobs whose worker died and returns how many."""
    from app.analytics.tasks import reap_stalled_buffer
    from app.email.bulk import requeue_stalled_jobs as requeue_stalled_email_jobs
    from app.embeddings.jobs import requeue_stalled_jobs as requeue_stalled_embedding_jobs
    from app.entities.bulk import requeue_orphaned_jobs
    from app.ops.rollout import requeue_stalled_rollouts
    from app.ops.seed_jobs import requeue_stalled_seed_jobs

    return [requeue_orphaned_jobs, reap_stalled_buffer, requeue_stalled_email_jobs, requeue_stalled_embedding_jobs,
            requeue_stalled_rollouts, requeue_stalled_seed_jobs]


def metric_sources(config: dict | None = None) -> dict:
    """What /metrics reads from PostgreSQL and Redis at scrape time (app.observability.metrics); the read
    replica's lag when DATABASE_REPLICA_URL is set."""
    from app.analytics.tasks import buffer_backlog
    from app.extensions import db
    from app.ops.rollout import rollout_progress
    from app.tasks import outbox_backlog, queue_lengths

    sources = {"queues": queue_lengths, "outbox": outbox_backlog, "analytics": buffer_backlog,
               "rollouts": rollout_progress}
    if (config or {}).get("DATABASE_REPLICA_URL"):
        sources["replica"] = db.replica_lag
    return sources


def _connect_task_signals() -> None:
    from celery.signals import task_failure

    from app.ops.tasks import record_failed_task

    # idempotent (dispatch_uid): several apps in one process record a failure once
    task_failure.connect(record_failed_task, weak=False, dispatch_uid="platform_gateway.failed_tasks")


def _install_hooks(app: Flask) -> None:
    from app.embeddings.hooks import install as install_semantic_search

    install_semantic_search(app)  # entity writes queue embeddings; `$similar` compiles to vector search


def _register_cli(app: Flask) -> None:
    from app.analytics.demo import analytics_cli
    from app.cli import artifacts_cli, db_cli, embeddings_cli, entities_cli, products_cli, seed_cli

    app.cli.add_command(analytics_cli)
    app.cli.add_command(db_cli)
    app.cli.add_command(entities_cli)
    app.cli.add_command(embeddings_cli)
    app.cli.add_command(products_cli)
    app.cli.add_command(seed_cli)
    app.cli.add_command(artifacts_cli)


def new_request_id() -> str:
    """`uuid.uuid4().hex` (random, version 4, RFC 4122 variant), without building a UUID object."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def _assign_request_id() -> None:
    # the environ entry `headers.get` reads, without its KeyError when the header is absent (most requests)
    incoming = current_request().environ.get("HTTP_X_REQUEST_ID", "")
    current_g().request_id = incoming if _SANE_REQUEST_ID.match(incoming) else new_request_id()


def _finish_response(response):
    config = app_object().config
    response = _refuse_oversized(response, config)
    response.headers["X-Request-ID"] = current_g().get("request_id") or new_request_id()
    origin = current_request().environ.get("HTTP_ORIGIN")  # headers.get("Origin"), see _assign_request_id
    if origin:
        origins = _cors_origins(config.get("CORS_ORIGINS") or "")
        if origin in origins or "*" in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = ("Authorization, Content-Type, X-Request-ID, "
                                                                "Idempotency-Key, If-Match, If-None-Match")
            response.headers["Access-Control-Expose-Headers"] = "ETag, Idempotent-Replayed, Location, Retry-After"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, PUT, DELETE, OPTIONS"
            response.headers["Vary"] = "Origin"
    return response


_CORS_PARSED: dict[str, frozenset[str]] = {}


def _cors_origins(setting: str) -> frozenset[str]:
    """The CORS_ORIGINS setting as a set of origins (parsed once per distinct value)."""
    origins = _CORS_PARSED.get(setting)
    if origins is None:
        if len(_CORS_PARSED) > 64:
            _CORS_PARSED.clear()
        origins = _CORS_PARSED[setting] = frozenset(o.strip() for o in setting.split(",") if o.strip())
    return origins


def _refuse_oversized(response, config=None):
    """A JSON answer above MAX_RESPONSE_BYTES (e.g. a page of huge records) is replaced by a 413 that
    says how to ask for less, instead of shipping hundreds of megabytes."""
    limit = (config if config is not None else current_app.config).get("MAX_RESPONSE_BYTES")
    # the cheap tests first (every answer but a huge one stops at its Content-Length)
    if (not limit or (response.content_length or 0) <= limit or response.direct_passthrough or response.is_streamed
            or response.mimetype != "application/json"):
        return response
    log.warning("response of %s bytes to %s refused (MAX_RESPONSE_BYTES %s)", response.content_length,
                current_request().path, limit)
    return error_response(413, "PAYLOAD_TOO_LARGE",
                          "The response would be larger than the service sends at once; ask for fewer "
                          "records (pageSize) or fewer fields.",
                          {"responseBytes": response.content_length, "maxResponseBytes": limit})
