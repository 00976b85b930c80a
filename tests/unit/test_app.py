"""The app factory's wiring (app/__init__.py): explicit, per app, loud when something is missing."""

from __future__ import annotations

import pytest

import app as app_package
from app.entities import hooks as entity_hooks
from app.extensions import celery_app


def test_a_missing_domain_module_stops_start_up(make_app, monkeypatch):
    monkeypatch.setattr(app_package, "DOMAINS", (*app_package.DOMAINS, "no_such_domain"))
    with pytest.raises(ModuleNotFoundError, match="no_such_domain"):
        make_app()


def test_task_modules_come_from_the_celery_config_and_hooks_are_per_app(app, make_app):
    assert {"bulk.entity_records", "embeddings.records", "embeddings.backfill", "ops.ping"} <= set(celery_app.tasks)
    other = make_app()
    for one in (app, other):
        with one.app_context():
            installed = entity_hooks.current()
            assert installed.records_written is not None and installed.similarity is not None
    assert app.extensions[entity_hooks.EXTENSION] is not other.extensions[entity_hooks.EXTENSION]
    assert entity_hooks.current() is entity_hooks.NONE  # outside an app: nothing installed


def test_ensure_sync_answers_per_function_what_flask_answers(app, monkeypatch):
    """GatewayFlask remembers whether a function is a coroutine function; each function keeps its own
    answer (a sync one is returned as is, an async one goes to async_to_sync), bound methods take
    their function's, and other callables are asked every time."""
    from flask import Flask

    converted = []
    monkeypatch.setattr(app, "async_to_sync", lambda func: converted.append(func) or "converted")

    def sync_view():
        return "sync"

    async def async_view():
        return "async"

    class View:
        def get(self):
            return "bound"

        async def post(self):
            return "async bound"

    for _ in range(2):  # the second round answers from what the first remembered
        assert app.ensure_sync(sync_view) is sync_view
        assert app.ensure_sync(async_view) == "converted"
        bound = View().get
        assert app.ensure_sync(bound) is bound
        assert app.ensure_sync(View().post) == "converted"
        partial = __import__("functools").partial(async_view)
        assert app.ensure_sync(partial) == Flask.ensure_sync(app, partial) == "converted"
    assert converted[0] is async_view and len(converted) == 8
