"""Celery settings: the reliability rules (late acks, fail fast when Redis is down; docs/operations.md,
"Celery and Redis"). Broker/backend come from REDIS_URL."""

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
timezone = "UTC"
enable_utc = True

# A task is acknowledged only after it finished; a worker lost mid-task puts it back on the queue.
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1
task_time_limit = 600
task_soft_time_limit = 540
result_expires = 24 * 3600
broker_connection_retry_on_startup = True
# Fail fast when Redis is down: a request that enqueues must not hang.
# visibility_timeout: a task taken by a worker that died unacknowledged is redelivered after this many
# seconds. It must exceed the longest a task may hold its message: task_time_limit (600 s) and the longest
# retry countdown (300 s, embeddings), else a live task would be delivered twice. Jobs with a status row
# are re-queued much sooner by the lease reaper (JOB_LEASE_SECONDS).
broker_transport_options = {"visibility_timeout": 900, "max_retries": 1, "interval_start": 0, "interval_step": 0.2,
                            "interval_max": 0.5, "socket_timeout": 2, "socket_connect_timeout": 2}
task_publish_retry_policy = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2,
                             "interval_max": 0.2}
# Tasks record their outcome in PostgreSQL (jobs, failed_tasks), so Celery results are off by
# default: a result subscription is one more Redis round trip that can hang when Redis is down.
task_ignore_result = True
result_backend_transport_options = {"retry_policy": {"max_retries": 1, "interval_start": 0,
                                                     "interval_step": 0.2, "interval_max": 0.2}}
redis_socket_timeout = 2
redis_socket_connect_timeout = 2
worker_send_task_events = True
task_send_sent_event = True

# Every module that defines tasks, imported by `init_celery` for each app (API, worker, CLI): a task
# is never registered as a side effect of importing routes. A new domain adds its tasks module here.
include = ("app.ops.tasks", "app.entities.tasks", "app.embeddings.tasks", "app.email.tasks", "app.analytics.tasks")

task_default_queue = "default"
task_routes = {
    "analytics.*": {"queue": "analytics"},
    "embeddings.*": {"queue": "embeddings"},
    "email.*": {"queue": "email"},
    "bulk.*": {"queue": "bulk"},
    "seed.*": {"queue": "seed"},
}
