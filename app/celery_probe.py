"""The worker's health check: `celery -A app.celery_probe inspect ping -d celery@$HOSTNAME`.

A Celery app with the deployment's broker settings (celeryconfig, REDIS_URL, CELERY_KEY_PREFIX:
`app.broker.configure_broker`, as every process uses) and nothing else: `-A workers` would build the
whole Flask app (routes, database engine) for each probe, several seconds of CPU every interval.
"""

from celery import Celery

from app.broker import configure_broker
from app.config import load_config

app = Celery("platform-gateway-probe")
configure_broker(app, load_config())
