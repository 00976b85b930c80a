"""Tasks of the `email` queue."""

from __future__ import annotations

from app.extensions import celery_app


@celery_app.task(name="email.bulk_send", ignore_result=True)
def bulk_send(product: str, job_id: str) -> str:
    """Send a bulk job's pending deliveries (idempotent: sent rows are never sent again)."""
    from app.email.bulk import run_job

    return run_job(product, job_id)
