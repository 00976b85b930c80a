"""The live gauges of app.observability.metrics (requests in flight, pooled connections in use): counted in
memory per process and written by a thread once a second, a forked child counting afresh."""

from __future__ import annotations

import time

from app.observability import metrics


class _Pool:
    def __init__(self, out: int) -> None:
        self.out = out

    def checkedout(self) -> int:
        return self.out


class _Engine:
    def __init__(self, out: int) -> None:
        self.pool = _Pool(out)


def _wait_until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_the_thread_writes_this_processes_counts_and_a_fork_starts_afresh():
    sampler = metrics._Recorder()
    engines = [_Engine(2), _Engine(3)]
    for engine in engines:
        sampler.engines.add(engine)
    sampler.in_flight = 4
    sampler.ensure_running()
    thread = sampler.thread
    assert thread is not None and thread.is_alive()
    assert _wait_until(lambda: sampler.written == (4, 5))  # every watched engine's pool, summed
    assert metrics.HTTP_IN_FLIGHT._value.get() == 4 and metrics.DB_POOL_IN_USE._value.get() == 5
    engines[1].pool.out = 0
    sampler.in_flight = 1
    assert _wait_until(lambda: sampler.written == (1, 2))
    # a forked child: its own count, no thread yet (the parent's is not in the child), the engines kept
    sampler.after_fork()
    assert (sampler.in_flight, sampler.thread, sampler.written) == (0, None, None)
    assert _wait_until(lambda: not thread.is_alive())  # the old thread sees it was replaced and ends
    assert len(sampler.engines) == 2
