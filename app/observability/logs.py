"""Structured logs: LOG_FORMAT=json writes one JSON object per line; `text` (the default) the plain line.

Every process writes its logs to its standard streams, in the format LOG_FORMAT chooses: the API's
processes (app logs through the root handler `configure` installs; gunicorn's error and access logs
through app.serving.AccessLogger), Celery's worker (`install_celery` puts the same formatter on the
handlers Celery sets up) and the CLI.

A JSON line always has `time` (UTC, ISO 8601, milliseconds), `level`, `logger` and `message`, and,
when known: `request_id` (the X-Request-ID the response carries), `trace_id` / `span_id` (tracing on:
app.observability.tracing), `org` / `product` (from the caller's verified token), `method`, `route`
(the route's template, e.g. `/api/v1/entities/<entity>/records/<record_id>`: no ids in it), and on a
worker `task_name` / `task_id`; an access line adds `status`, `duration_ms`, `path` (the request target
as sent), `bytes`, `remote_addr`, `protocol`, `user_agent`; a logged exception its traceback in
`exception` (newlines escaped: still one line).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from flask import Flask, g, has_request_context, request

from app.observability import tracing

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"
# the access line's fields the app knows and gunicorn does not (set by `remember_for_access_log`)
ENVIRON_KEY = "platform_gateway.log"

# the attributes of every LogRecord: anything else on a record came from `extra=` and is logged too
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def check_format(value: str) -> str:
    """LOG_FORMAT, validated: `text` or `json`."""
    fmt = (value or "text").strip().lower()
    if fmt not in FORMATS:
        raise RuntimeError(f"LOG_FORMAT={value!r}: `text` (one plain line per event, the default) or `json` "
                           "(one JSON object per line)")
    return fmt


def configured_format() -> str:
    """LOG_FORMAT of this process's configuration (environment, then ENV_FILE), for code that runs
    before an app exists (gunicorn's arbiter)."""
    from app.config import load_config

    return check_format(load_config()["LOG_FORMAT"])


class RequestIdFilter(logging.Filter):
    """Gives the plain line its `[request id]` (`-` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.request_id = g.get("request_id", "-")
        except RuntimeError:
            record.request_id = "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if access is not None:  # gunicorn's access line: the request has ended, its fields travel with it
            entry.update(access)
        else:
            entry.update(context_fields())
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in ("access", "request_id") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str, separators=(",", ":"))


def context_fields() -> dict[str, Any]:
    """What the current request or task says about a log line: request id, tenant, route, trace, task."""
    fields: dict[str, Any] = {}
    if has_request_context():
        request_id = g.get("request_id")
        if request_id:
            fields["request_id"] = request_id
        tenant = g.get("tenant")
        if tenant is not None:
            fields["org"], fields["product"] = tenant.org_id, tenant.product
        fields["method"] = request.method
        if request.url_rule is not None:
            fields["route"] = request.url_rule.rule
    ids = tracing.current_ids()
    if ids is not None:
        fields["trace_id"], fields["span_id"] = ids
    task = _current_task()
    if task is not None:
        fields["task_name"], fields["task_id"] = task.name, task.request.id
    return fields


def _current_task():
    from celery._state import get_current_task

    task = get_current_task()
    return task if task is not None and getattr(task.request, "id", None) else None


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure(app: Flask) -> None:
    """The process's log handler (one, on the root logger, shared by every app of the process) in
    LOG_FORMAT, at LOG_LEVEL; with `json`, the fields the access line needs from the app."""
    fmt = check_format(app.config.get("LOG_FORMAT", "text"))
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "_platform_gateway", False)), None)
    if handler is None:
        handler = logging.StreamHandler()
        handler._platform_gateway = True  # type: ignore[attr-defined]
        handler.addFilter(RequestIdFilter())
        root.addHandler(handler)
    handler.setFormatter(formatter(fmt))
    root.setLevel(app.config["LOG_LEVEL"])
    if fmt == "json":
        logging.captureWarnings(True)  # a warning is a log line too, not free text on stderr
        app.after_request(remember_for_access_log)


def remember_for_access_log(response):
    """Leave in the WSGI environ what gunicorn's access line (app.serving.AccessLogger) cannot know:
    the route template, the tenant, the trace (its span is over when gunicorn logs)."""
    request.environ[ENVIRON_KEY] = context_fields()
    return response


def access_fields(resp, environ, request_time) -> dict[str, Any]:
    """The fields of gunicorn's access line in JSON (`resp`: gunicorn's Response)."""
    status = resp.status
    status = int(status.split(None, 1)[0]) if isinstance(status, str) else status
    fields: dict[str, Any] = {
        "remote_addr": environ.get("REMOTE_ADDR"),
        "method": environ.get("REQUEST_METHOD"),
        "path": environ.get("RAW_URI"),
        "protocol": environ.get("SERVER_PROTOCOL"),
        "status": status,
        "bytes": getattr(resp, "sent", None),
        "duration_ms": round(request_time.total_seconds() * 1000, 3),
        "user_agent": environ.get("HTTP_USER_AGENT"),
    }
    known = environ.get(ENVIRON_KEY)
    if known:
        fields.update(known)
    request_id = next((value for name, value in resp.headers if name.lower() == "x-request-id"), None)
    if request_id:
        fields["request_id"] = request_id
    return {name: value for name, value in fields.items() if value is not None}


def install_celery(fmt: str) -> None:
    """In a Celery worker with LOG_FORMAT=json: Celery's log handlers (the worker's, the tasks') write
    JSON lines, and the start-up banner (free text) is left out."""
    if check_format(fmt) != "json":
        return
    from celery.signals import after_setup_logger, after_setup_task_logger, celeryd_init

    def use_json(logger=None, **_kwargs) -> None:
        for handler in getattr(logger, "handlers", ()):
            handler.setFormatter(JsonFormatter())

    def quiet(instance=None, **_kwargs) -> None:
        if instance is not None:
            instance.quiet = True  # Celery's banner; "celery@host ready." is logged

    logging.captureWarnings(True)
    import celery.apps.worker as celery_worker

    celery_worker.safe_say = say_as_json  # its shutdown notices, written from signal handlers
    after_setup_logger.connect(use_json, weak=False, dispatch_uid="platform_gateway.json_logs")
    after_setup_task_logger.connect(use_json, weak=False, dispatch_uid="platform_gateway.json_task_logs")
    celeryd_init.connect(quiet, weak=False, dispatch_uid="platform_gateway.json_quiet")


def say_as_json(msg, f=None) -> None:
    """Celery's `safe_say` (free text written straight to a stream from a signal handler: "worker: Warm
    shutdown (MainProcess)"), as one JSON line, written the same way (one os.write, no logging lock)."""
    import sys

    stream = f if f is not None else sys.__stderr__
    record = logging.LogRecord("celery.apps.worker", logging.WARNING, __file__, 0, str(msg).strip(), (), None)
    line = JsonFormatter().format(record) + "\n"
    try:
        os.write(stream.fileno(), line.encode())
    except (OSError, ValueError, AttributeError):  # best effort, as Celery's: never abort a shutdown
        pass
