"""Which entity writes queue embedding work (the hooks run inside the writing transaction)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from app.embeddings.hooks import on_definition_changed, on_records_written
from app.embeddings.pipeline import config_fingerprint, setup_of

ON = {"enabled": True, "fields": ["body"]}


@pytest.fixture()
def session():
    engine = create_engine("sqlite://").execution_options(schema_translate_map={"product": "product_acme"})
    with Session(bind=engine) as s:
        yield s


def queued(session):
    return [(task.name, args) for task, args, *_ in session.info.get("_pending_tasks", [])]


def definition(config):
    return SimpleNamespace(id="def-1", org_id="org-1", embeddings_config=config)


@pytest.mark.parametrize("previous,current,backfills", [
    (None, ON, True),                                              # enabled later
    ({**ON, "enabled": False}, ON, True),                          # switched back on
    (ON, {**ON, "fields": ["body", "title"]}, True),               # fields changed
    (ON, {**ON, "model": "text-embedding-3-small"}, True),         # model changed
    (ON, {**ON, "dimensions": 256}, True),                         # dimensions changed
    (ON, dict(ON), False),                                         # saved unchanged
    (ON, {**ON, "enabled": False}, False),                         # switched off: nothing to embed
    (None, None, False),
])
def test_definition_changes_that_backfill(session, previous, current, backfills):
    on_definition_changed(session, "acme", definition(current), previous)
    expected = [("embeddings.backfill", ("acme", "org-1", "def-1", config_fingerprint(current), ""))]
    assert queued(session) == (expected if backfills else [])


def test_records_are_queued_in_chunks_only_when_enabled(session):
    ids = [f"r{i:04d}" for i in range(600)]
    on_records_written(session, "acme", definition({**ON, "enabled": False}), ids)
    assert queued(session) == []
    on_records_written(session, "acme", definition(ON), ids)
    tasks = queued(session)
    assert [name for name, _ in tasks] == ["embeddings.records"] * 3
    assert [args[3] for _, args in tasks] == [ids[:256], ids[256:512], ids[512:]]
    assert all(args[:3] == ("acme", "org-1", "def-1") for _, args in tasks)


def test_setup_ignores_enabled_and_normalises_empty_values():
    assert setup_of({"enabled": True, "fields": [], "model": "", "dimensions": 0}) == setup_of({"enabled": False})
    assert config_fingerprint(ON) != config_fingerprint({**ON, "fields": ["title"]})
