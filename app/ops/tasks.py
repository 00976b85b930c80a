"""Operational tasks and the failed-task recorder (connected by `init_celery`, not at import)."""

from __future__ import annotations

import json
import logging

from celery.exceptions import SoftTimeLimitExceeded

from app.db import db
from app.errors import ApiError
from app.extensions import celery_app
from app.ops.rollout import ROLLOUT_TASK, chain_next_batch, run_rollout
from app.ops.seed_jobs import SEED_TASK, run_leased
from app.ops.seeding import seed_org
from app.platform_models import FailedTask, Rollout
from app.tasks import lease_of
from app.wire import utcnow

log = logging.getLogger(__name__)


@celery_app.task(name="ops.ping", ignore_result=False)
def ping(value: str = "pong") -> str:
    """Round trip through a worker (used by health tooling and tests)."""
    return value


def record_failed_task(sender=None, task_id=None, exception=None, args=None, kwargs=None, **_):
    """A task that failed for good (retries exhausted or not retryable) lands in platform.failed_tasks."""
    try:
        with db.product_session(db.default_product) as session:
            session.add(FailedTask(task_id=str(task_id), task_name=getattr(sender, "name", str(sender)),
                                   args=_jsonable(args or []), kwargs=_jsonable(kwargs or {}),
                                   error=f"{type(exception).__name__}: {exception}"[:4000]))
    except Exception:  # recording must never mask the original failure
        log.exception("could not record failed task %s", task_id)


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return json.loads(json.dumps(value, default=str))


@celery_app.task(name=SEED_TASK, bind=True, ignore_result=False)
def seed_org_task(self, org: dict | None = None, admin: dict | None = None) -> dict:
    """Seed one organization (the same service as POST /internal/seed); idempotent, so a redelivered
    task reports everything as existing. A message of an accepted async seed is leased (its job in the
    task id: app.ops.seed_jobs); an operator's `celery -A workers call seed.org --kwargs '{...}'` is not."""
    def work() -> dict:
        try:
            report = seed_org({"org": org, "admin": admin})
        except ApiError as exc:  # a bad body is not retryable: report it as the result
            log.warning("seed.org rejected: %s %s", exc.message, exc.details)
            return {"error": {"code": exc.code, "message": exc.message, "details": exc.details}}
        log.info("seed.org %s/%s: %s", report["orgId"], report["product"], report["summary"])
        return report

    return run_leased(self.request.id, work)


@celery_app.task(name=ROLLOUT_TASK, bind=True, ignore_result=True)
def rollout_task(self, rollout_id: str, batch_size: int = 100) -> str:
    """One batch of orgs per message, then the next batch's message is written to the outbox (before the
    batch lets go of the rollout: app.ops.rollout.chain_next_batch): other seed tasks interleave, and a
    lost worker or a task killed by its time limit leaves the rollout to the rollout lease reaper, which
    sends the batch again (it resumes from the rollout's cursor). The message's dispatch token comes
    with its task id (app.tasks.lease_message_id); a message without one (the previous release's, an
    operator's `celery call`) runs unleased and hands the rest to a leased chain."""
    lease = lease_of(self.request.id)
    token = lease[1] if lease is not None and lease[0] == rollout_id else None
    try:
        return run_rollout(rollout_id, batch_size=batch_size, max_batches=None if self.request.is_eager else 1,
                           token=token, chain=chain_next_batch)
    except Exception as exc:
        db.session.rollback()
        rollout = db.session.get(Rollout, rollout_id)
        if rollout is not None:
            rollout.status, rollout.updated_at, rollout.lease_expires_at = "failed", utcnow(), None
            if isinstance(exc, SoftTimeLimitExceeded):
                rollout.error = (f"A batch exceeded the task time limit ({self.app.conf.task_soft_time_limit} s); "
                                 "resume continues from the last org done.")
            else:
                rollout.error = f"{type(exc).__name__}: {exc}"[:2000]
            db.session.commit()
        raise
