"""Configuration: every setting and its default lives here, environment variables override.

`load_config(overrides)` is the only reader of the environment. Beneath the environment it reads the
settings file ENV_FILE (default: `.env` beside the Makefile, KEY=value lines, python-dotenv), so
`make run`, the workers and every CLI call share one configuration whatever shell they run in (a
variable set in the environment wins). Tests pass overrides to `create_app()` instead of patching the
environment (and run with ENV_FILE empty). The README's configuration table lists the
same names (tests/unit/test_config.py checks that it stays complete).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dotenv import dotenv_values

# The checkout (the image: /srv/app), where the Makefile and the .env file are.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (default, type, one-line description used for the README table)
SETTINGS: dict[str, tuple[Any, type, str]] = {
    # Process and HTTP
    "ENV_FILE": (os.path.join(PROJECT_ROOT, ".env"), str, "Settings file (KEY=value lines) every process reads "
                 "beneath the environment; default `.env` beside the Makefile; empty = none. Only the "
                 "environment sets it"),
    "VAR_DIR": ("./var", str, "Local state: embedded PostgreSQL, blobs, outbox, generated JWT secret"),
    "PORT": (8000, int, "Port `make run` serves on"),
    "PUBLIC_BASE_URL": ("http://localhost:8000", str, "How clients reach this service (used in blob URLs)"),
    "LOG_LEVEL": ("INFO", str, "Python log level"),
    "LOG_FORMAT": ("text", str, "`text` (one plain line per event) or `json` (one JSON object per line: time, "
                                "level, logger, request id, trace id, org, product, route; the access log "
                                "adds status and duration); API, gunicorn, workers and CLI alike"),
    "MAX_CONTENT_LENGTH": (100 * 1024 * 1024, int, "Largest accepted request body in bytes (413 above)"),
    "JSON_MAX_DEPTH": (64, int, "Deepest nesting of a JSON request body (400 above)"),
    "MAX_STRING_CHARS": (32 * 1024 * 1024, int, "Longest string in a JSON request body, in characters "
                                               "(413 above; inline base64 images need megabytes)"),
    "MAX_RESPONSE_BYTES": (64 * 1024 * 1024, int, "Largest JSON response in bytes; a larger page is refused "
                                                 "(413: ask for a smaller pageSize)"),
    "JSON_FIELD_MAX_BYTES": (64 * 1024, int, "Largest free-form JSON object field (`metadata`, `config`, "
                                             "`defaultConfig`, a view's `config`…) as compact UTF-8 JSON, bytes "
                                             "(400 above)"),
    "JSON_SCHEMA_MAX_BYTES": (256 * 1024, int, "Largest JSON Schema field (`configSchema`, `inputSchema`, "
                                               "`outputSchema`, an entity definition's `schema`) as compact UTF-8 "
                                               "JSON, bytes (400 above)"),
    "CORS_ORIGINS": ("", str, "Comma-separated origins allowed by CORS; empty = CORS off"),
    "IDEMPOTENCY_TTL_SECONDS": (86400, int, "How long an `Idempotency-Key` and its stored answer are kept from "
                                            "the first request, seconds (a retry within it is replayed; the "
                                            "workers' maintenance loop deletes expired keys)"),
    "IDEMPOTENCY_LOCK_SECONDS": (300, int, "How long a running request holds its `Idempotency-Key` (duplicates "
                                           "get 409 meanwhile); after it, a process that died mid-request is "
                                           "assumed dead and a retry runs. Above any request's run time "
                                           "(image calls: IMAGE_TIMEOUT_SECONDS)"),
    "IDEMPOTENCY_MAX_ANSWER_BYTES": (1024 * 1024, int, "Largest answer body stored for an `Idempotency-Key` "
                                                       "replay, bytes; a larger one keeps only its status, "
                                                       "headers, size and sha256, and a retry gets 409 "
                                                       "IDEMPOTENCY_ANSWER_NOT_STORED (it ran; look it up)"),
    # Metrics (Prometheus; docs/operations.md, "Metrics")
    "METRICS_ENABLED": (True, bool, "Record Prometheus metrics and serve them on /metrics (API) and "
                                    "WORKER_METRICS_PORT (workers), to INTERNAL_API_TOKEN holders only"),
    "PROMETHEUS_MULTIPROC_DIR": ("", str, "Where the processes of one gunicorn master or Celery worker share "
                                          "their metric files; empty = VAR_DIR/metrics (one directory per "
                                          "server inside, cleared at its start)"),
    "WORKER_METRICS_PORT": (9808, int, "Port a Celery worker's main process serves /metrics on (all "
                                       "interfaces; taken by another worker on the host: the next free of "
                                       "the 10 ports from it, logged); 0 = none"),
    # Database
    "DATABASE_URL": ("", str, "PostgreSQL+pgvector URL; empty = embedded PostgreSQL under VAR_DIR/pg"),
    "DB_POOL_SIZE": (10, int, "SQLAlchemy pool size per process"),
    "DB_POOL_TIMEOUT": (5, int, "Seconds to wait for a pooled connection before answering 503"),
    "DB_PING_IDLE_SECONDS": (10.0, float, "Ping a pooled connection at checkout when it sat idle longer than "
                                          "this (seconds); busy connections are not pinged"),
    "DB_STATEMENT_TIMEOUT_MS": (30000, int, "PostgreSQL statement_timeout for request transactions (ms)"),
    "DB_PLAN_CACHE_MODE": ("force_custom_plan", str, "PostgreSQL plan_cache_mode of every pooled connection: "
                                                     "a filter's values drive its plan, so prepared statements "
                                                     "are planned for their values (`auto`: PostgreSQL's default)"),
    "DATABASE_REPLICA_URL": ("", str, "PostgreSQL streaming replica (hot standby) for the reads that tolerate lag: "
                                      "analytics dashboards, global roll-ups, the console's data; no database "
                                      "name = the primary's; empty = every read on the primary"),
    "DB_REPLICA_MAX_LAG_SECONDS": (30.0, float, "Lag-tolerant reads go to the primary while the replica is "
                                                "further behind than this (seconds; sampled every 2 s per "
                                                "process); 0 = any lag"),
    "DB_REPLICA_RETRY_SECONDS": (10.0, float, "After the replica failed (connect, disconnect), lag-tolerant "
                                              "reads use the primary for this long before trying it again"),
    # Celery / Redis
    "REDIS_URL": ("", str, "Redis URL for Celery broker/results; empty = tasks run eagerly in-process"),
    "CELERY_KEY_PREFIX": ("", str, "Prefix of every Celery key in Redis (isolates deployments/test runs "
                                   "sharing one Redis database)"),
    # Analytics ingest (buffer drained by the `analytics.flush` task)
    "ANALYTICS_BATCH_SIZE": (20000, int, "Events stored per ingest transaction"),
    "ANALYTICS_FLUSH_BUDGET_SECONDS": (20, int, "How long one flush task drains the buffer before re-arming"),
    "ANALYTICS_FLUSH_PARALLEL": (2, int, "Flush tasks that may drain the buffer at once (a backlog of a batch "
                                         "or more starts helpers); run worker concurrency to match"),
    "ANALYTICS_FLUSH_TTL_SECONDS": (60, int, "Lifetime of the flush-pending flag (a lost flush task is "
                                              "replaced after this long)"),
    "ANALYTICS_INFLIGHT_STALE_SECONDS": (120, int, "An in-flight batch older than this (its worker died) "
                                                   "is put back into the buffer"),
    "OUTBOX_DISPATCH_INTERVAL_SECONDS": (5.0, float, "How often each worker re-sends outbox tasks the broker did not "
                                                     "take (Redis outage) and re-queues orphaned jobs"),
    "OUTBOX_DISPATCH_AFTER_SECONDS": (10.0, float, "Age of an outbox row before a worker re-sends it (the request "
                                                   "normally sends it right after its commit)"),
    "JOB_LEASE_SECONDS": (60.0, float, "A running job not held by a live worker for this long is re-queued "
                                       "(worker killed mid-job)"),
    "JOB_MAX_ATTEMPTS": (3, int, "Runs a leased job (bulk job, email slice, embedding job, rollout batch) may start "
                                 "without finishing (worker lost, task time limit) before the lease reaper fails "
                                 "it with the reason instead of sending it again"),
    "CELERY_TASK_TIME_LIMIT": (600, int, "Hard time limit of every task, seconds (the worker kills the task's "
                                         "process; its job is left to the lease reaper)"),
    "CELERY_TASK_SOFT_TIME_LIMIT": (540, int, "Soft time limit of every task, seconds (SoftTimeLimitExceeded "
                                              "is raised in the task); below CELERY_TASK_TIME_LIMIT; 0 = none"),
    # Rate limits per organization ("<requests>/<seconds>"; empty or 0 = unlimited)
    "RATE_LIMIT_IMAGES": ("60/60", str, "Image generations per organization and window"),
    "RATE_LIMIT_BULK": ("120/60", str, "Bulk create/update/delete calls (sync or async jobs) per organization"),
    "RATE_LIMIT_AGGREGATE": ("600/60", str, "Record aggregations per organization"),
    "RATE_LIMIT_SIMILAR": ("600/60", str, "Record queries/counts using `$similar` per organization"),
    "RATE_LIMIT_EMAIL": ("120/60", str, "Email sends per organization"),
    "RATE_LIMIT_REDIS_RETRY_SECONDS": (5.0, float, "After a Redis error, count in-process for this long before "
                                                   "trying Redis again"),
    # Concurrency per organization (fairness): requests of a group one organization may have in flight at
    # once across all API processes (0 = unlimited)
    "CONCURRENCY_LIMIT_RECORDS": (4, int, "Record queries, counts and aggregations one organization may have in "
                                          "flight at once (429 RATE_LIMITED beyond; 0 = unlimited)"),
    "CONCURRENCY_LIMIT_INGEST": (16, int, "Event ingest calls (`POST /analytics/events`, `/events/batch`) one "
                                          "organization may have in flight at once (0 = unlimited)"),
    "CONCURRENCY_LEASE_SECONDS": (60.0, float, "A concurrency slot its request never freed (the process died) "
                                               "frees itself after this long"),
    # Auth and tenancy
    "JWT_SECRET": ("", str, "HS256 secret, at least 32 bytes; empty = generated into VAR_DIR/jwt-secret (dev)"),
    "JWT_ISSUER": ("platform-gateway", str, "Required `iss` claim"),
    "JWT_AUDIENCE": ("platform-api", str, "Required `aud` claim"),
    "JWT_LEEWAY_SECONDS": (30, int, "Clock skew tolerated on exp/iat"),
    "DEFAULT_PRODUCT": ("default", str, "Product used when a token has no `product` claim"),
    "INTERNAL_API_TOKEN": ("", str, "Shared token for /internal/* calls (X-Internal-Token)"),
    # Console (/console)
    "CONSOLE_DEV_SIGNIN": (False, bool, "Development sign-in on /console (trusts the typed identity; never "
                                        "enable where real data lives)"),
    "CONSOLE_TOKEN_TTL_SECONDS": (900, int, "Lifetime of the access tokens the console's session hands its "
                                            "page (refreshed about 5 minutes before expiry)"),
    "CONSOLE_SESSION_TTL_SECONDS": (28800, int, "Lifetime of a console session cookie"),
    # Blob storage
    "BLOB_BACKEND": ("local", str, "`local` (files under VAR_DIR/blobs, served at /blobs) or `gcs`"),
    "BLOB_CONTAINER": ("platform-images", str, "Container (local folder / GCS bucket) for stored images"),
    "BLOB_PUBLIC_BASE_URL": ("", str, "Public base URL of blobs; empty = PUBLIC_BASE_URL + /blobs (local) "
                                      "or https://storage.googleapis.com (gcs)"),
    "GCS_PROJECT": ("", str, "Google Cloud project for the gcs backend"),
    "GCS_ENDPOINT": ("", str, "Override the GCS API endpoint (emulators, tests)"),
    # Image generation
    "IMAGE_REF_ALLOWED_HOSTS": ("", str, "Extra hosts allowed for reference/mask URLs (comma-separated)"),
    "IMAGE_TIMEOUT_SECONDS": (120, float, "Budget for one image call (fetch + upstream + store), seconds"),
    "PROVIDER_A_ENDPOINT": ("", str, "Azure OpenAI endpoint, e.g. https://NAME.openai.azure.com"),
    "PROVIDER_A_API_KEY": ("", str, "Azure OpenAI api-key"),
    "PROVIDER_A_API_VERSION": ("2025-04-01-preview", str, "api-version for image generations"),
    "PROVIDER_A_EDIT_API_VERSION": ("2025-04-01-preview", str, "api-version for image edits"),
    "PROVIDER_A_LEGACY_DEPLOYMENTS": ("", str, "Deployments of the legacy (dall-e-3) family, comma-separated"),
    "PROVIDER_B_ENDPOINT": ("", str, "Vertex AI base URL; empty = https://{location}-aiplatform.googleapis.com"),
    "PROVIDER_B_PROJECT": ("", str, "Google Cloud project for Imagen"),
    "PROVIDER_B_LOCATION": ("us-central1", str, "Vertex AI region"),
    "PROVIDER_B_CREDENTIALS": ("", str, "Path of a service-account JSON for Imagen"),
    "PROVIDER_B_ACCESS_TOKEN": ("", str, "Static OAuth bearer token for Imagen (instead of credentials)"),
    # Embeddings
    "EMBEDDINGS_BACKEND": ("local", str, "`local` (bundled sentence-transformers model) or `openai`"),
    "EMBEDDINGS_ENDPOINT": ("", str, "OpenAI-compatible base URL (…/v1) for the openai backend"),
    "EMBEDDINGS_API_KEY": ("", str, "API key for the openai backend"),
    "EMBEDDINGS_MODEL": ("", str, "Embedding model; empty = backend default (local: bundled all-MiniLM-L6-v2, "
                                  "or a local sentence-transformers directory; openai: text-embedding-3-large)"),
    "EMBEDDINGS_DIMENSIONS": (0, int, "Default `dimensions` sent to the openai backend; 0 = the model's native size"),
    "EMBEDDINGS_AUTH_HEADER": ("auto", str, "openai backend auth: `bearer`, `api-key` (Azure), or `auto` "
                                            "(api-key for `*.azure.com` hosts)"),
    "EMBEDDINGS_BATCH_SIZE": (64, int, "Texts per model call (local) or per HTTP request (openai, max 2048)"),
    "EMBEDDINGS_TIMEOUT_SECONDS": (30, float, "Read timeout of one openai-backend request (connect: 5 s)"),
    "EMBEDDINGS_MAX_TEXT_CHARS": (8000, int, "Cap on the text embedded for one record"),
    "EMBEDDINGS_LOCAL_THREADS": (1, int, "torch threads per process for the local model (scale with processes); "
                                         "0 = torch default (one per core)"),
    "EMBEDDINGS_QUERY_CACHE_TTL": (300, float, "Seconds a `$similar` query vector stays cached (per org); 0 = off"),
    "EMBEDDINGS_QUERY_CACHE_SIZE": (1024, int, "Query vectors kept in each process's LRU cache"),
    "EMBEDDINGS_TASK_MAX_RETRIES": (5, int, "Retries (exponential backoff) of an embedding task on transient "
                                            "embedder or database errors"),
    "EMBEDDINGS_JOB_LEASE_SECONDS": (300.0, float, "An embedding job (records task or backfill walk) whose "
                                                   "message has not started, or whose worker died, for this "
                                                   "long is sent again by the embedding lease reaper"),
    "EMBEDDINGS_HNSW_EF_SEARCH": (100, int, "`hnsw.ef_search` of a `$similar` query (raised to the page end; "
                                            "max 1000)"),
    "EMBEDDINGS_EXACT_SEARCH_MAX_ROWS": (2000, int, "`$similar` over at most this many matching records is an "
                                                    "exact scan instead of the HNSW index"),
    # Entity store
    "ENTITY_MAX_PAGE_SIZE": (500, int, "Largest `pageSize` of a record query (400 above)"),
    "ENTITY_MAX_BULK_RECORDS": (5000, int, "Most records (or ids) in one bulk create/update/delete"),
    "ENTITY_FILTER_MAX_DEPTH": (8, int, "Deepest nesting of $and/$or/$not in a record filter"),
    "ENTITY_FILTER_MAX_CONDITIONS": (100, int, "Most conditions in one record filter"),
    "ENTITY_FILTER_MAX_LIST": (1000, int, "Most values in one $in/$nin list"),
    "ENTITY_MAX_RECORD_BYTES": (1024 * 1024, int, "Largest record (name, fields, tags, metadata as JSON, bytes; "
                                                  "400 above)"),
    "ENTITY_AGGREGATE_MAX_GROUPS": (1000, int, "Default and largest `limit` of a record aggregation (groups)"),
    "ENTITY_COUNT_ESTIMATE_ABOVE": (10000, int, "With `Prefer: count=estimated`, totalCount is exact up to this "
                                                "many (planner-estimated) matches and the estimate beyond"),
    "ENTITY_INDEX_MIN_RECORDS": (5000, int, "A definition with at least this many active records gets its own "
                                            "per-field indexes and typed projection table (built in the "
                                            "background)"),
    "ENTITY_SUBSTRING_TABLES": (8, int, "Short text fields per projected definition that get a substring table "
                                        "(exact counts of substring matches on one field read it; writes cost "
                                        "more): the first by field name; 0: none. A change rebuilds projections"),
    # Agent registry
    "REGISTRY_MAX_DOCUMENT_BYTES": (1024 * 1024, int, "Largest stored agent, catalog skill, tool definition, "
                                                      "sub-agent or widget as JSON, bytes (400 above)"),
    "ENTITY_LIST_DEFAULT_LIMIT": (100, int, "Items per page of the entity definition and view lists when `limit` "
                                            "is not given"),
    "ENTITY_LIST_MAX_LIMIT": (1000, int, "Largest `limit` of the entity definition and view lists (400 above)"),
    "ENTITY_LIST_MAX_BYTES": (8 * 1024 * 1024, int, "A page of the entity definition or view list ends before "
                                                    "the item that would take it past this many bytes "
                                                    "(`nextCursor` goes on); a larger item comes alone on its page"),
    "REGISTRY_LIST_DEFAULT_LIMIT": (100, int, "Items per page of an agent-registry list when `limit` is not given"),
    "REGISTRY_LIST_MAX_LIMIT": (1000, int, "Largest `limit` of an agent-registry list (400 above)"),
    "REGISTRY_LIST_MAX_BYTES": (8 * 1024 * 1024, int, "A page of an agent-registry list ends before the item that "
                                                      "would take it past this many bytes (`nextCursor` goes on); "
                                                      "a larger item comes alone on its page"),
    # Email
    "EMAIL_BACKEND": ("console", str, "`console` (VAR_DIR/outbox + log) or `smtp`"),
    "SMTP_HOST": ("localhost", str, "SMTP server"),
    "SMTP_PORT": (587, int, "SMTP port"),
    "SMTP_USERNAME": ("", str, "SMTP user"),
    "SMTP_PASSWORD": ("", str, "SMTP password"),
    "SMTP_STARTTLS": (True, bool, "Use STARTTLS"),
    "EMAIL_FROM": ("Platform Gateway <no-reply@localhost>", str, "From address"),
    "EMAIL_BULK_MAX_RECIPIENTS": (10_000, int, "Most messages / recipients one bulk-send request may carry"),
    "EMAIL_BULK_CONCURRENCY": (4, int, "SMTP connections one bulk job sends over in parallel"),
    "EMAIL_BULK_MAX_ATTEMPTS": (3, int, "Tries per recipient for transient SMTP failures (4xx, dropped connection)"),
    "EMAIL_BULK_RETRY_SECONDS": (2.0, float, "Unit of the retry delay of a transient failure "
                                                 "(app.tasks.retry_countdown: doubles, jitter)"),
    "EMAIL_BULK_SLICE_SIZE": (500, int, "Recipients one task of a bulk job sends before it hands the rest to "
                                        "the next task (chained through the outbox)"),
    "EMAIL_BULK_LEASE_SECONDS": (300.0, float, "A bulk job whose next slice has not started (or whose slice has "
                                               "not reported) for this long, and that no worker holds, is "
                                               "dispatched again by the email lease reaper"),
    "NEWSLETTER_MAX_RECIPIENTS": (50_000, int, "Most active subscribers one newsletter issue is sent to "
                                               "(400 above)"),
}


def _coerce(value: Any, kind: type) -> Any:
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return kind(value)


def env_file_values(path: str) -> dict[str, str]:
    """The settings of the file `path` (python-dotenv's syntax); a relative VAR_DIR there is relative to
    the file. {} for an empty path or a missing default file."""
    if not path:
        return {}
    if not os.path.isfile(path):
        if path == SETTINGS["ENV_FILE"][0]:
            return {}
        raise RuntimeError(f"ENV_FILE={path} does not exist (unset ENV_FILE for the default .env, or set it "
                           "empty to read none)")
    values = {name: value for name, value in dotenv_values(path).items() if value is not None}
    if values.get("VAR_DIR"):
        values["VAR_DIR"] = os.path.join(os.path.dirname(os.path.abspath(path)), values["VAR_DIR"])
    return values


def _flask_cli_dotenv(env_file: str) -> dict[str, str]:
    """What the `flask` command itself loaded into the environment before any of our code ran: it reads
    the `.env` and `.flaskenv` it finds from the working directory. When ENV_FILE names another file
    (e.g. the local stack's), those values must not win over it: an environment value equal to the one
    in that dotenv file is taken as loaded by `flask`, not set by the caller. {} outside the `flask` CLI."""
    if os.path.basename(sys.argv[0] if sys.argv else "") != "flask" or os.environ.get("FLASK_SKIP_DOTENV"):
        return {}
    from dotenv import dotenv_values, find_dotenv

    loaded: dict[str, str] = {}
    for name in (".flaskenv", ".env"):
        path = find_dotenv(name, usecwd=True)
        if path and os.path.abspath(path) != os.path.abspath(env_file or ""):
            loaded.update({k: v for k, v in dotenv_values(path).items() if v is not None})
    return loaded


def load_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then the settings file (ENV_FILE), then environment variables, then explicit
    overrides (tests). VAR_DIR_EXPLICIT says whether anyone chose VAR_DIR (app.embedded_pg)."""
    overrides = overrides or {}
    env_file = overrides.get("ENV_FILE", os.environ.get("ENV_FILE", SETTINGS["ENV_FILE"][0]))
    from_file = env_file_values(env_file)
    by_flask = _flask_cli_dotenv(env_file) if from_file else {}
    environ = {name: value for name, value in os.environ.items()
               if not (name in from_file and by_flask.get(name) == value)}
    config: dict[str, Any] = {}
    for name, (default, kind, _doc) in SETTINGS.items():
        if name in overrides:
            config[name] = overrides[name]
        elif name in environ:
            config[name] = _coerce(environ[name], kind)
        elif name in from_file and name != "ENV_FILE":
            config[name] = _coerce(from_file[name], kind)
        else:
            config[name] = default
    config["ENV_FILE"] = env_file
    for name, value in overrides.items():  # Flask/extension keys (TESTING, …)
        config.setdefault(name, value)
    config["VAR_DIR_EXPLICIT"] = any("VAR_DIR" in source for source in (overrides, environ, from_file))
    config["VAR_DIR"] = os.path.abspath(config["VAR_DIR"])
    return config


def csv_setting(value: str) -> list[str]:
    """Split a comma-separated setting into clean, non-empty items."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]
