"""A real Celery worker on Redis runs tasks sent by the app."""

import os
import subprocess

from app.ops.tasks import ping
from tests.conftest import BIN, CELERY_KEY_PREFIX


def test_real_worker_round_trip(celery_worker):
    result = ping.apply_async(args=["hello"])
    assert result.get(timeout=30) == "hello"


def _probe(node: str, redis_url: str, prefix: str = CELERY_KEY_PREFIX):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    env.update(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix, VAR_DIR="/nonexistent/not-created")
    return subprocess.run([os.path.join(BIN, "celery"), "-A", "app.celery_probe", "inspect", "ping", "-d", node,
                           "--timeout", "5"], cwd="/", env=env, capture_output=True, text=True, timeout=120)


def test_the_compose_health_check_pings_the_worker_without_building_the_app(celery_worker, redis_url):
    """docker/compose.yaml's worker health check (`celery -A app.celery_probe inspect ping -d NODE`) answers
    for a live worker of this deployment (key prefix included), from any directory, without a database."""
    ok = _probe(celery_worker.hostname, redis_url)
    assert ok.returncode == 0 and "pong" in ok.stdout, ok.stdout + ok.stderr
    assert _probe("nobody@nowhere", redis_url).returncode != 0
    assert _probe(celery_worker.hostname, redis_url, prefix="another-deployment:").returncode != 0
    assert not os.path.exists("/nonexistent")
