"""Tasks of the `email` queue."""

from __future__ import annotations

from flask import current_app

from app.email.bulk import SEND_TASK, run_job
from app.extensions import celery_app
from app.tasks import lease_of


@celery_app.task(name=SEND_TASK, bind=True, ignore_result=True)
def bulk_send(self, product: str, job_id: str, token: int | None = None) -> str:
    """Send one slice of a bulk job (EMAIL_BULK_SLICE_SIZE recipients); the slice chains the next one
    through the outbox. Idempotent: sent rows are never sent again, and a message whose dispatch token
    is not the job's current one does nothing (app.email.bulk). Eager mode sends the whole job.
    The token comes with the task id (app.tasks.lease_message_id); `token` is taken for messages of
    the release that passed it as an argument."""
    lease = lease_of(self.request.id)
    if token is None and lease is not None and lease[0] == job_id:
        token = lease[1]
    slice_size = None if self.request.is_eager else max(1, int(current_app.config["EMAIL_BULK_SLICE_SIZE"]))
    return run_job(product, job_id, token, slice_size=slice_size)
