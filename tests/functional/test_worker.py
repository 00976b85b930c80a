"""A real Celery worker on Redis runs tasks sent by the app."""

from app.ops.tasks import ping


def test_real_worker_round_trip(celery_worker):
    result = ping.apply_async(args=["hello"])
    assert result.get(timeout=30) == "hello"
