"""app.threadpool.RecentThreadPool: the serving worker's request threads, idle ones woken last-in first-out."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import pytest

from app.threadpool import RecentThreadPool


def _name() -> str:
    return threading.current_thread().name


def _all_idle(pool: RecentThreadPool, n: int) -> None:
    """Until `n` threads are idle (a thread goes back on the stack just after its future is done)."""
    deadline = time.monotonic() + 5
    while len(pool._idle) < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(pool._idle) == n


def test_a_job_goes_to_the_thread_that_went_idle_last():
    pool = RecentThreadPool(4)
    try:
        gate = threading.Event()
        started = threading.Barrier(5)  # the four jobs and this thread

        def hold(i):
            started.wait(5)
            gate.wait(5)
            return _name()

        names = [pool.submit(hold, i) for i in range(4)]
        started.wait(5)  # four threads, each holding a job
        gate.set()
        done = [f.result(5) for f in names]
        assert len(set(done)) == 4
        _all_idle(pool, 4)  # which one went idle last is the stack's top
        last = pool._idle[-1]
        ran = pool.submit(_name).result(5)
        _all_idle(pool, 4)
        assert pool._idle[-1] is last  # the same thread went back on top
        ran_next = set()
        for _ in range(20):  # one at a time (each after the last went idle): always that one
            ran_next.add(pool.submit(_name).result(5))
            _all_idle(pool, 4)
        assert ran_next == {ran}
    finally:
        pool.shutdown()


def test_threads_are_started_on_demand_up_to_max_workers_and_jobs_beyond_wait_in_order():
    pool = RecentThreadPool(3)
    try:
        gate = threading.Event()
        order = []
        lock = threading.Lock()

        def job(i):
            gate.wait(5)
            with lock:
                order.append(i)
            return i

        assert pool.submit(_name).result(5)
        _all_idle(pool, 1)  # one thread, idle again
        assert len(pool._threads) == 1
        fs = [pool.submit(job, i) for i in range(10)]
        assert len(pool._threads) == 3 and len(pool._pending) == 7
        gate.set()
        assert [f.result(5) for f in fs] == list(range(10))
        assert sorted(order) == list(range(10)) and len(pool._threads) == 3
    finally:
        pool.shutdown()
    pool = RecentThreadPool(1)  # one thread: the waiting jobs run in submission order
    try:
        gate.clear()
        order.clear()
        fs = [pool.submit(job, i) for i in range(10)]
        gate.set()
        futures.wait(fs, 5)
        assert order == list(range(10))
    finally:
        pool.shutdown()


def test_exceptions_and_results_reach_the_future_and_the_thread_serves_on():
    pool = RecentThreadPool(1)
    try:
        def fail():
            raise KeyError("boom")

        failed = pool.submit(fail)
        assert isinstance(failed.exception(5), KeyError)
        assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(5) == 5
        seen = []
        done = pool.submit(lambda: 1)
        done.add_done_callback(lambda f: seen.append(f.result()))
        done.result(5)
        assert seen == [1]
    finally:
        pool.shutdown()


def test_shutdown_ends_idle_threads_runs_or_cancels_what_is_pending_and_refuses_more():
    pool = RecentThreadPool(1)
    gate = threading.Event()
    first = pool.submit(gate.wait, 5)
    pending = [pool.submit(lambda i=i: i) for i in range(3)]
    closer = threading.Thread(target=pool.shutdown, kwargs={"wait": True})
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive()  # waits for the busy thread
    with pytest.raises(RuntimeError):
        pool.submit(_name)
    gate.set()
    closer.join(5)
    assert not closer.is_alive() and first.result(0) is True
    assert [f.result(0) for f in pending] == [0, 1, 2]  # pending jobs ran before the thread ended
    assert not pool._threads

    pool = RecentThreadPool(1)
    gate = threading.Event()
    pool.submit(gate.wait, 5)
    pending = pool.submit(_name)
    pool.shutdown(wait=False, cancel_futures=True)
    assert pending.cancelled()
    gate.set()
    deadline = time.monotonic() + 5
    while pool._threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pool._threads


def test_idle_threads_end_at_shutdown_without_waiting():
    pool = RecentThreadPool(4)
    fs = [pool.submit(time.sleep, 0.05) for _ in range(4)]
    futures.wait(fs, 5)
    threads = set(pool._threads)
    assert len(threads) == 4
    pool.shutdown(wait=False)
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()


def test_the_serving_worker_uses_it_unless_told_otherwise(monkeypatch):
    from app.serving import EnvelopeThreadWorker

    worker = EnvelopeThreadWorker.__new__(EnvelopeThreadWorker)
    worker.cfg = type("Cfg", (), {"threads": 3})()
    monkeypatch.delenv("GUNICORN_THREAD_POOL", raising=False)
    pool = worker.get_thread_pool()
    assert isinstance(pool, RecentThreadPool) and pool._max == 3
    pool.shutdown()
    monkeypatch.setenv("GUNICORN_THREAD_POOL", "executor")
    pool = worker.get_thread_pool()
    assert isinstance(pool, futures.ThreadPoolExecutor)
    pool.shutdown()


def test_a_linger_ends_with_the_sockets_bytes_its_time_or_a_job_that_needs_a_thread():
    import socket

    pool = RecentThreadPool(1)
    a, b = socket.socketpair()
    try:
        started = time.monotonic()
        assert pool.linger(a, 0.05) is False and time.monotonic() - started >= 0.04  # nothing came
        b.sendall(b"x")
        assert pool.linger(a, 5) is True  # bytes to read: at once
        a.recv(1)
        # a thread lingers (the pool's one thread busy with it); a job submitted meanwhile must wait for
        # a thread, so the linger ends at once and that thread can take it
        gate = threading.Event()
        lingered = []

        def linger_then_free():
            gate.set()
            t0 = time.monotonic()
            lingered.append((pool.linger(a, 5), time.monotonic() - t0))

        busy = pool.submit(linger_then_free)
        gate.wait(5)
        deadline = time.monotonic() + 5
        while not pool._lingering and time.monotonic() < deadline:
            time.sleep(0.001)
        waiting = pool.submit(_name)
        assert waiting.result(5)  # ran on the thread that stopped lingering
        busy.result(5)
        assert lingered[0][0] is False and lingered[0][1] < 1.0, lingered
        assert not pool._signaled and not pool._lingering  # the pipe emptied by the last one out
        started = time.monotonic()
        assert pool.linger(a, 0.05) is False and time.monotonic() - started >= 0.04  # waits fully again
        # while a job is waiting for a thread, a new linger does not start
        gate2 = threading.Event()
        pool.submit(gate2.wait, 5)
        pending = pool.submit(_name)
        assert pool._pending and pool.linger(a, 5) is False
        gate2.set()
        pending.result(5)
    finally:
        pool.shutdown()
        a.close()
        b.close()
