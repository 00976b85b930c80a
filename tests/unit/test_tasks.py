"""The Celery integration (app.tasks): send-after-commit, eager tasks in the caller's app, the retry policy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from app.tasks import MAX_BACKOFF_SECONDS, enqueue_after_commit, retry_countdown, retry_or_give_up


class RecordingTask:
    """A task whose app runs eagerly (no broker, no outbox) unless `broker=True`; `fail=True` makes
    every send fail as with Redis down."""

    name = "recording"

    def __init__(self, broker: bool = False, fail: bool = False):
        self.sent, self.ids, self.fail = [], [], fail
        self.app = SimpleNamespace(conf=SimpleNamespace(task_always_eager=not broker))

    def apply_async(self, args=(), kwargs=None, task_id=None):
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((args, kwargs))
        self.ids.append(task_id)


def test_enqueue_after_commit_sends_only_on_commit(database_url):
    engine = create_engine(database_url)
    task = RecordingTask()
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        enqueue_after_commit(session, task, 1, x=2)
        assert task.sent == []
        session.rollback()
        assert task.sent == []
        enqueue_after_commit(session, task, 3)
        session.execute(text("SELECT 1"))
        session.commit()
    assert task.sent == [((3,), {})]
    engine.dispose()


def test_enqueue_inside_a_savepoint_waits_for_the_outer_commit(database_url):
    engine = create_engine(database_url)
    task = RecordingTask()
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        with session.begin_nested():  # SQLAlchemy fires after_commit when a SAVEPOINT is released
            enqueue_after_commit(session, task, "job")
        assert task.sent == []
        session.commit()
    assert task.sent == [(("job",), {})]
    engine.dispose()


def test_eager_task_runs_in_the_calling_apps_context(make_app, app):
    """With Celery bound to the main app, a task run inside another app's context sees that app."""
    from app.extensions import celery_app
    from app.tasks import init_celery
    from tests.support import which_app

    second = make_app(PUBLIC_BASE_URL="http://second.test")
    init_celery(celery_app, app)  # Celery is bound to the main app again
    with second.app_context():
        assert which_app.apply().get() == "http://second.test"
    with app.app_context():
        assert which_app.apply().get() == app.config["PUBLIC_BASE_URL"]


def test_tasks_have_the_app_context_base_whatever_finalized_celery_first():
    """A process that finalizes Celery (task_named, celery_app.tasks) before any init_celery still builds
    every task on AppContextTask: an eager task never runs in its caller's context (mid-commit session)."""
    import subprocess
    import sys

    code = ("from app.tasks import AppContextTask, task_named\n"
            "task = task_named('seed.rollout')\n"
            "from app.extensions import celery_app\n"
            "bad = [n for n, t in celery_app.tasks.items() if not n.startswith('celery.') "
            "and not isinstance(t, AppContextTask)]\n"
            "assert isinstance(task, AppContextTask) and not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_eager_task_sent_by_a_tasks_commit_runs_in_its_own_session(app):
    """Eager mode: a task that a task sends after its commit (its unit of work's) runs in a context of its
    own, not inline in the sender's, whose session is mid-commit (after_commit: no SQL) at that point."""
    from app.extensions import celery_app
    from tests.support import SESSION_READS, send_read_session

    saved = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    SESSION_READS.clear()
    try:
        with app.app_context():
            assert send_read_session.apply(args=(7,)).successful()
            assert SESSION_READS == [7]  # without its own context: InvalidRequestError, logged, not run
            send_read_session.delay(8)  # sent the way a request sends it
            assert SESSION_READS == [7, 8]
    finally:
        celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = saved


@pytest.mark.parametrize("broker_up", [True, False])
def test_outbox_row_commits_with_the_transaction(app, database_url, broker_up):
    """With a broker, the task is an outbox row of the same transaction: none after a rollback; after
    the commit it is sent with the row id as task id and the row deleted, or kept when the send fails."""
    from sqlalchemy import select

    from app.db import db
    from app.platform_models import OutboxMessage

    task = RecordingTask(broker=True, fail=not broker_up)
    with app.app_context():
        with Session(db.engine) as session:
            enqueue_after_commit(session, task, "rolled-back")
            session.rollback()
            enqueue_after_commit(session, task, "kept", flag=True)
            pending = session.execute(select(OutboxMessage.args).where(OutboxMessage.task_name == "recording")
                                      ).scalars().all()
            assert pending.count(["kept"]) == 1 and ["rolled-back"] not in pending  # a row of this transaction
            assert task.sent == []  # nothing leaves before the commit
            session.commit()
        with db.engine.connect() as conn:
            rows = conn.execute(select(OutboxMessage.id, OutboxMessage.args, OutboxMessage.kwargs)
                                .where(OutboxMessage.task_name == "recording")).all()
    assert not any(r.args == ["rolled-back"] for r in rows)
    if broker_up:
        assert task.sent == [(("kept",), {"flag": True})]
        assert task.ids[0] not in {r.id for r in rows}  # sent: its row is gone
    else:
        assert task.sent == []
        mine = [r for r in rows if r.args == ["kept"]]
        assert mine and mine[-1].kwargs == {"flag": True}  # waits for the dispatcher
        with app.app_context(), db.engine.begin() as conn:
            conn.execute(OutboxMessage.__table__.delete().where(OutboxMessage.task_name == "recording"))


def test_retry_countdown_is_exponential_with_jitter_capped_and_honours_retry_after():
    for retries in range(4):
        assert 2 ** retries <= retry_countdown(retries) <= 1.5 * 2 ** retries
    assert retry_countdown(20) == MAX_BACKOFF_SECONDS
    assert retry_countdown(0, retry_after=7) == 7 and retry_countdown(0, retry_after=10_000) == MAX_BACKOFF_SECONDS


def test_retry_or_give_up():
    scheduled = []

    def retry(**kwargs):
        scheduled.append(kwargs)
        return RuntimeError("retry scheduled")

    exc = ValueError("db down")
    task = SimpleNamespace(name="t", request=SimpleNamespace(retries=1), retry=retry)
    assert str(retry_or_give_up(task, exc, 3)) == "retry scheduled"
    assert scheduled[0]["exc"] is exc and scheduled[0]["max_retries"] == 3 and 2 <= scheduled[0]["countdown"] <= 3
    task.request.retries = 3
    assert retry_or_give_up(task, exc, 3) is exc and len(scheduled) == 1


def test_lease_of_reads_only_the_ids_lease_message_id_makes():
    """A task id is `<job id>~<token>~<random>` (app.tasks.lease_message_id) or not a lease at all: hostile
    ids (an operator's `--task-id`, a broker client) are unleased, never an error in every task that
    reads its id (int() of a non-ASCII digit such as '²' raised ValueError, failing the task)."""
    from app.tasks import lease_message_id, lease_of

    assert lease_of(lease_message_id("job-1", 7)) == ("job-1", 7)
    for hostile in (None, "", "plain-uuid", "a~1", "a~b~c", "~1~x", "a~1~x~y", "a~-1~x", "a~²~x", "a~٣~x",
                    "a~ 1~x", "a~1.0~x", "a~" + "9" * 5000 + "~x"):
        assert lease_of(hostile) is None, hostile


def test_retry_jitter_leaves_the_random_modules_state_alone():
    """The jitter has its own generator: a retry scheduled on a background thread does not move the
    `random` module's shared state (Hypothesis warns when it changes while a test draws)."""
    import random

    state = random.getstate()
    countdowns = {retry_countdown(3) for _ in range(20)}
    assert random.getstate() == state and len(countdowns) > 1
