"""Wiring of semantic search into the entity store: its write hooks and its `$similar` hook.

`install()` is called once by app.entities.routes (so the API and every worker process have it);
importing app.embeddings.tasks here registers the embedding tasks with the worker.
"""

from __future__ import annotations

from app.embeddings import tasks as _tasks  # noqa: F401  (registers embeddings.* tasks)
from app.embeddings.pipeline import on_definition_changed, on_records_written
from app.embeddings.search import similarity_clause
from app.entities.filters import register_similarity_hook
from app.entities.services import register_write_hooks


def install() -> None:
    """Record and definition writes queue embedding work; `$similar` compiles to vector search."""
    register_write_hooks(records_written=on_records_written, definition_changed=on_definition_changed)
    register_similarity_hook(similarity_clause)
