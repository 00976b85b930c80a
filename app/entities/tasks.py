"""Celery tasks of the entity store (queue `bulk`)."""

from __future__ import annotations

import logging

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError

from app.entities import bulk, indexes
from app.extensions import celery_app
from app.tasks import retry_or_give_up

log = logging.getLogger(__name__)


@celery_app.task(name=bulk.RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
                 max_retries=3)
def run_bulk_job(self, job_id: str, product: str) -> str:
    """Run an asynchronous bulk job. Idempotent: a finished job is skipped, and the writes commit
    together with the final status, so a redelivered job never writes twice."""
    if not bulk.claim_job(job_id, product, new_run=not self.request.retries):
        return "skipped"
    try:
        return bulk.execute_job(job_id, product)
    except SoftTimeLimitExceeded:  # it would run as long again: fail it with the reason (writes rolled back)
        log.error("bulk job %s exceeded the soft time limit", job_id)
        limit = self.soft_time_limit or self.app.conf.task_soft_time_limit
        bulk.fail_job(job_id, product, f"The bulk job exceeded the task time limit ({limit} s); nothing was written.")
        raise
    except OperationalError as exc:  # transient database trouble: retry (the one policy of app.tasks)
        outcome = retry_or_give_up(self, exc, self.max_retries)
        if outcome is exc:
            bulk.fail_job(job_id, product, "The bulk job could not be completed (database unavailable).")
            raise
        raise outcome from exc
    except Exception:
        log.exception("bulk job %s failed", job_id)
        bulk.fail_job(job_id, product, "The bulk job failed unexpectedly.")
        raise


@celery_app.task(name=indexes.SYNC_TASK, acks_late=True, reject_on_worker_lost=True)
def sync_definition_indexes(product: str, definition_id: str) -> dict:
    """Create/drop a definition's per-field indexes (app.entities.indexes); idempotent."""
    return indexes.sync_definition(product, definition_id)
