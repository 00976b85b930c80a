"""Wiring of semantic search into the entity store: its write hooks and its `$similar` hook.

`install(app)` is called by `create_app` for every app (API, worker, CLI); the hooks run inside the
writing transaction and queue the embedding tasks (app.embeddings.tasks) once it commits.
"""

from __future__ import annotations

from flask import Flask
from sqlalchemy.orm import Session

from app.embeddings.jobs import queue_backfill, queue_records
from app.embeddings.pipeline import RECORDS_PER_TASK, config_fingerprint, is_enabled, setup_of
from app.embeddings.search import similarity_clause
from app.entities import hooks as entity_hooks
from app.entities.models import EntityDefinition


def install(app: Flask) -> None:
    """Record and definition writes queue embedding work; `$similar` compiles to vector search."""
    entity_hooks.install(app, entity_hooks.EntityHooks(
        records_written=on_records_written, definition_changed=on_definition_changed,
        similarity=similarity_clause))


def on_records_written(session: Session, product: str, definition: EntityDefinition, record_ids: list[str]) -> None:
    """Queue embedding of created/updated records once the write commits (enabled definitions only)."""
    if not is_enabled(definition.embeddings_config):
        return
    for start in range(0, len(record_ids), RECORDS_PER_TASK):
        queue_records(session, product, definition.org_id, definition.id,
                      list(record_ids[start:start + RECORDS_PER_TASK]))


def on_definition_changed(session: Session, product: str, definition: EntityDefinition,
                          previous: dict | None) -> None:
    """Enabling embeddings, or changing fields/model/dimensions, re-embeds the records in the background."""
    config = definition.embeddings_config
    if not is_enabled(config):
        return
    if is_enabled(previous) and setup_of(previous) == setup_of(config):
        return
    queue_backfill(session, product, definition.org_id, definition.id, config_fingerprint(config), "")
