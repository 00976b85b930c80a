"""The entity store's extension points, installed per app by `create_app` (never at import time).

Work that follows writes (embeddings) and what `$similar` compiles to plug in here. The write hooks
run inside the writing transaction, before its commit, so they can queue Celery tasks with
`enqueue_after_commit`; they get the product explicitly (a task never recovers it from a session).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flask import Flask, current_app, has_app_context
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from app.entities.models import EntityDefinition
    from app.entities.similar import SimilarityHook

# records_written(session, product, definition, record_ids): records were created or updated
RecordsWrittenHook = Callable[[Session, str, "EntityDefinition", list[str]], None]
# definition_changed(session, product, definition, previous_embeddings_config): a definition was updated
DefinitionChangedHook = Callable[[Session, str, "EntityDefinition", "dict | None"], None]
EXTENSION = "entity_hooks"


@dataclass(frozen=True)
class EntityHooks:
    records_written: RecordsWrittenHook | None = None
    definition_changed: DefinitionChangedHook | None = None
    similarity: SimilarityHook | None = None


NONE = EntityHooks()


def install(app: Flask, hooks: EntityHooks) -> None:
    """Install `hooks` for `app` (one set per app: several apps in one process stay apart)."""
    app.extensions[EXTENSION] = hooks


def current() -> EntityHooks:
    """The hooks of the current app (none outside an app context or when nothing was installed)."""
    return current_app.extensions.get(EXTENSION, NONE) if has_app_context() else NONE
