"""Celery tasks of the entity store (queue `bulk`)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError

from app.entities import bulk
from app.extensions import celery_app
from app.tasks import register_lease_reaper

log = logging.getLogger(__name__)


@celery_app.task(name="bulk.entity_records", bind=True, acks_late=True, reject_on_worker_lost=True,
                 max_retries=3)
def run_bulk_job(self, job_id: str, product: str) -> str:
    """Run an asynchronous bulk job. Idempotent: a finished job is skipped, and the writes commit
    together with the final status, so a redelivered job never writes twice."""
    if not bulk.claim_job(job_id, product):
        return "skipped"
    try:
        return bulk.execute_job(job_id, product)
    except OperationalError as exc:  # transient database trouble: retry with backoff
        if self.request.retries >= self.max_retries:
            log.error("bulk job %s failed after %s retries: %s", job_id, self.request.retries, exc)
            bulk.fail_job(job_id, product, "The bulk job could not be completed (database unavailable).")
            raise
        raise self.retry(exc=exc, countdown=2 ** self.request.retries) from exc
    except Exception:
        log.exception("bulk job %s failed", job_id)
        bulk.fail_job(job_id, product, "The bulk job failed unexpectedly.")
        raise


register_lease_reaper(bulk.requeue_orphaned_jobs)
