"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and no import cycle comes back.

`lint-imports` reads every import of app/, function-local ones included: the core never imports a
domain, services never import routes, schemas never import services, and no two modules of a domain
(or packages of app) import each other, directly or through others. A task module imports its
service; the service sends the task by its registered name (app.tasks.enqueue_after_commit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.email.bulk import SEND_TASK
from app.embeddings.jobs import BACKFILL_TASK, RECORDS_TASK
from app.entities.bulk import RUN_TASK
from app.entities.indexes import SYNC_TASK
from app.ops.rollout import ROLLOUT_TASK
from app.ops.seed_jobs import SEED_TASK
from app.tasks import task_named

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("import-linter is not installed (requirements-dev.txt)")
    # this checkout's app/, not whichever one the environment's editable install points at
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_services_send_tasks_that_are_registered():
    """Every task a service sends by name is a registered task of that name (a typo would only show
    when the message is sent)."""
    names = {SEND_TASK, BACKFILL_TASK, RECORDS_TASK, RUN_TASK, SYNC_TASK, ROLLOUT_TASK, SEED_TASK}
    assert names == {"email.bulk_send", "embeddings.backfill", "embeddings.records", "bulk.entity_records",
                     "bulk.entity_indexes", "seed.rollout", "seed.org"}  # the names messages already carry
    assert {task_named(name).name for name in names} == names


def test_an_unknown_task_name_is_refused():
    with pytest.raises(LookupError, match="no Celery task named 'email.nope'"):
        task_named("email.nope")
