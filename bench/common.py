"""Helpers for benchmarks: percentiles, tables, a migrated benchmark database and an app."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
BENCH_SECRET = "bench-secret-" + "z" * 40


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def timed(fn: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    """Run `fn` n times after a warm-up; returns latencies in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99),
            "mean": statistics.fmean(samples), "n": len(samples)}


def table(headers: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    headers = list(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(c) for c in row) + " |")
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def write_result(name: str, title: str, body: str, notes: str = "") -> str:
    os.makedirs(RESULTS, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# {title}\n\nRun {stamp} on {platform.machine()} with {os.cpu_count()} cores, "
            f"Python {platform.python_version()}.\n\n{body}\n")
    if notes:
        text += f"\n{notes}\n"
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as fh:
        fh.write(text)
    print(text, flush=True)
    return text


def bench_database_url() -> str:
    """A dedicated, migrated database for benchmarks (embedded unless BENCH_DATABASE_URL is set)."""
    from sqlalchemy import create_engine

    from migrations.runner import upgrade_all

    url = os.environ.get("BENCH_DATABASE_URL")
    if not url:
        from app.embedded_pg import embedded_url

        url = embedded_url(os.path.join(ROOT, "var"), "platform_gateway_bench")
    engine = create_engine(url)
    upgrade_all(engine, "default")
    engine.dispose()
    return url


def bench_app(**overrides):
    from app import create_app

    config = {"DATABASE_URL": bench_database_url(), "JWT_SECRET": BENCH_SECRET, "LOG_LEVEL": "WARNING",
              "VAR_DIR": os.path.join(ROOT, "var", "bench"), "REDIS_URL": ""}
    config.update(overrides)
    return create_app(config)


def bench_token(org: str, scopes=("read", "write"), role=None) -> str:
    from app.auth import mint_token

    return mint_token(secret=BENCH_SECRET, issuer="platform-gateway", audience="platform-api", org=org,
                      user="bench", scopes=scopes, role=role, ttl=7200)
