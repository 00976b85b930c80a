"""The Celery integration (app.tasks): send-after-commit, eager tasks in the caller's app, the retry policy."""

from __future__ import annotations

from types import SimpleNamespace

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from app.tasks import MAX_BACKOFF_SECONDS, enqueue_after_commit, retry_countdown, retry_or_give_up


class RecordingTask:
    name = "recording"

    def __init__(self):
        self.sent = []

    def apply_async(self, args=(), kwargs=None):
        self.sent.append((args, kwargs))


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
