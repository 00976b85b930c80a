"""The broker settings follow the task time limits: Redis must not hand a running task's message to a
second worker (visibility timeout above the time limit), and a soft limit must come before the hard one."""

import pytest
from celery import Celery

from app.broker import configure_broker
from app.config import load_config


def _configured(**settings) -> Celery:
    celery = Celery("test-broker-config")
    configure_broker(celery, load_config({"REDIS_URL": "redis://127.0.0.1:6379/0", "ENV_FILE": "", **settings}))
    return celery


def test_the_visibility_timeout_stays_above_a_long_time_limit():
    celery = _configured(CELERY_TASK_TIME_LIMIT=1800, CELERY_TASK_SOFT_TIME_LIMIT=1700)
    assert celery.conf.task_time_limit == 1800
    assert celery.conf.broker_transport_options["visibility_timeout"] > 1800


def test_the_default_limits_keep_the_default_visibility_timeout_and_the_prefix():
    celery = _configured(CELERY_KEY_PREFIX="p:")
    options = celery.conf.broker_transport_options
    assert options["visibility_timeout"] == 900 and options["global_keyprefix"] == "p:"


def test_a_soft_limit_at_or_above_the_hard_one_is_refused():
    with pytest.raises(RuntimeError, match="CELERY_TASK_SOFT_TIME_LIMIT"):
        _configured(CELERY_TASK_TIME_LIMIT=100, CELERY_TASK_SOFT_TIME_LIMIT=100)
