"""Operational checks."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from flask import current_app
from sqlalchemy import text

from app.db import db
from app.storage import get_blob_store


def _timed(check: Callable[[], None]) -> dict:
    start = time.perf_counter()
    try:
        check()
    except Exception as exc:  # a health check reports, it never raises
        return {"status": "fail", "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"status": "ok", "latencyMs": round((time.perf_counter() - start) * 1000, 2)}


def _check_database() -> None:
    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def _check_redis() -> None:
    client = redis.Redis.from_url(current_app.config["REDIS_URL"], socket_timeout=1,
                                  socket_connect_timeout=1)
    try:
        client.ping()
    finally:
        client.close()


def _check_blob_storage() -> None:
    get_blob_store().check()


def health_report() -> tuple[dict, bool]:
    """Status of each backing service; healthy only when every configured check passes."""
    checks = {"database": _timed(_check_database)}
    if current_app.config.get("REDIS_URL"):
        checks["redis"] = _timed(_check_redis)
    checks["blobStorage"] = _timed(_check_blob_storage)
    healthy = all(c["status"] == "ok" for c in checks.values())
    return {"status": "ok" if healthy else "degraded", "checks": checks}, healthy
