"""A real Celery worker on Redis runs tasks sent by the app."""

import os
import subprocess

from app.ops.tasks import ping
from tests.conftest import BIN, CELERY_KEY_PREFIX


def test_real_worker_round_trip(celery_worker):
    result = ping.apply_async(args=["hello"])
    assert result.get(timeout=30) == "hello"


def _probe(node: str, redis_url: str, prefix: str = CELERY_KEY_PREFIX) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    env.update(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix, VAR_DIR="/nonexistent/not-created")
    return subprocess.Popen([os.path.join(BIN, "celery"), "-A", "app.celery_probe", "inspect", "ping", "-d", node,
                             "--timeout", "5"], cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _result(probe: subprocess.Popen) -> tuple[int, str]:
    out, _ = probe.communicate(timeout=120)
    return probe.returncode, out


def test_the_compose_health_check_pings_the_worker_without_building_the_app(celery_worker, redis_url):
    """docker/compose.yaml's worker health check (`celery -A app.celery_probe inspect ping -d NODE`) answers
    for a live worker of this deployment (key prefix included), from any directory, without a database."""
    # the three probes run side by side (the two that get no answer each wait their full 5 s)
    probes = [_probe(celery_worker.hostname, redis_url), _probe("nobody@nowhere", redis_url),
              _probe(celery_worker.hostname, redis_url, prefix="another-deployment:")]
    (ok, out), (nobody, _), (elsewhere, _) = [_result(probe) for probe in probes]
    assert ok == 0 and "pong" in out, out
    assert nobody != 0
    assert elsewhere != 0
    assert not os.path.exists("/nonexistent")
