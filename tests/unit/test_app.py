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
