"""The objects behind Flask's context proxies, for the code every request runs.

`flask.request`, `flask.g` and `flask.current_app` are werkzeug `LocalProxy` objects: each attribute read
through one (`request.path`, `g.get(...)`, `current_app.config`) first fails the normal lookup on the
proxy (an AttributeError with its message formatted, then discarded) and then runs the proxy's Python
lookup: about 8 000 interpreter instructions, ten times the read itself. The request hooks read some 50
of them per request. These functions return the object itself from the context variable Flask keeps it
in (the same object the proxy would reach), so a hook pays that once and reads plain attributes after.
Outside a context they answer as the proxy does (RuntimeError "Working outside of … context"), or
None for the `*_or_none` forms.
"""

from __future__ import annotations

from typing import Any

from flask import current_app, g, request
from flask.globals import _cv_app, _cv_request


def current_request() -> Any:
    """`flask.request`'s Request object."""
    ctx = _cv_request.get(None)
    return ctx.request if ctx is not None else request._get_current_object()  # raises as the proxy does


def request_or_none() -> Any:
    """The current Request object, or None outside a request context (`if request:`)."""
    ctx = _cv_request.get(None)
    return ctx.request if ctx is not None else None


def current_g() -> Any:
    """`flask.g`'s object (the app context's namespace)."""
    ctx = _cv_app.get(None)
    return ctx.g if ctx is not None else g._get_current_object()  # raises as the proxy does


def g_or_none() -> Any:
    """The app context's `g`, or None outside an app context (`g.get(…) if has_app_context()`)."""
    ctx = _cv_app.get(None)
    return ctx.g if ctx is not None else None


def app_object() -> Any:
    """`flask.current_app`'s Flask object."""
    ctx = _cv_app.get(None)
    return ctx.app if ctx is not None else current_app._get_current_object()  # raises as the proxy does


def app_or_none() -> Any:
    """The current Flask object, or None outside an app context (`current_app if has_app_context()`)."""
    ctx = _cv_app.get(None)
    return ctx.app if ctx is not None else None
