"""Start-up refusal, scope logic and the send-after-commit helper."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from app.auth import scope_satisfies
from app.tasks import enqueue_after_commit


def test_weak_secret_refuses_start(make_app):
    with pytest.raises(RuntimeError, match="at least 32 bytes"):
        make_app(JWT_SECRET="short-secret")


@pytest.mark.parametrize("held,required,ok", [
    ("read", "read:agents", True), ("write", "write:entities", True), ("admin", "admin:x", True),
    ("read", "write:agents", False), ("read:agents", "read:entities", False),
    ("read:agents", "read:agents", True), ("*", "anything", True)])
def test_scope_satisfies(held, required, ok):
    assert scope_satisfies(held, required) is ok


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
