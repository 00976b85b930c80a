"""A thread pool that gives each job to the thread that went idle last (the serving worker's pool).

gunicorn's gthread worker runs each request on a `concurrent.futures.ThreadPoolExecutor`. Its idle
threads all wait on one queue, and the lock behind it wakes the waiter that has waited longest: with
requests coming one at a time, each request runs on a different thread (12-14 of a worker's threads
took turns in one measured run), whose stack, frames and the objects it touched last are long out of
the CPU's caches by then. `RecentThreadPool` keeps its idle threads on a stack: a job goes to the
thread that finished its job last, whose data is still warm; the others stay asleep. The interface
is the part of `ThreadPoolExecutor` the worker uses: `submit` (a `concurrent.futures.Future`,
exceptions set on it), `shutdown(wait, cancel_futures)`; at most `max_workers` threads, started on
demand; jobs beyond them wait in submission order.

`linger(sock, seconds)`: a thread that has just answered on a kept-alive connection may wait there for
the connection's next request (app.serving) instead of handing it back to gunicorn's main thread. Such
a wait gives way to other work: as soon as a job has to wait for a thread, every lingering thread stops
waiting (a pipe in their poll() set), goes back to the pool and takes it.
"""

from __future__ import annotations

import os
import select
import threading
from collections import deque
from concurrent import futures
from typing import Any


class _Slot:
    """An idle thread's place on the stack: its own lock, held while it sleeps, released to wake it
    with `job` (None: the pool shut down)."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: tuple | None = None


def _execute(job: tuple) -> None:
    future, fn, args, kwargs = job
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 (as ThreadPoolExecutor: the future carries it)
        future.set_exception(exc)
        job = future = None  # no reference cycle through the traceback
    else:
        future.set_result(result)


class RecentThreadPool:
    """`ThreadPoolExecutor`'s `submit`/`shutdown`, idle threads woken last-in first-out (see the module)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "pool") -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []            # the most recently idle last
        self._pending: deque[tuple] = deque()   # jobs waiting for a thread (all threads busy)
        self._threads: set[threading.Thread] = set()
        self._started = 0
        self._shutdown = False
        self._lingering = 0                     # threads in `linger`
        self._wake: tuple[int, int] | None = None  # the pipe that ends their waits (made on first use)
        self._signaled = False                  # a byte is in it
        _register_atexit(self._at_exit)

    def submit(self, fn, /, *args: Any, **kwargs: Any) -> futures.Future:
        future: futures.Future = futures.Future()
        job = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                slot.wake.release()
                return future
            if len(self._threads) >= self._max:
                self._pending.append(job)
                self._signal()  # lingering threads: this job needs one of you
                return future
            self._started += 1
            thread = threading.Thread(target=self._work, args=(job,), name=f"{self._prefix}_{self._started}")
            self._threads.add(thread)
        thread.start()
        return future

    def linger(self, sock, seconds: float) -> bool:
        """Wait up to `seconds` for `sock` to have bytes to read, unless a job is waiting for a thread (or
        comes to wait meanwhile): True when `sock` is readable. In poll(), no CPU while waiting."""
        with self._lock:
            if self._pending or self._shutdown:
                return False
            if self._wake is None:
                self._wake = os.pipe()
                for fd in self._wake:
                    os.set_blocking(fd, False)
            self._lingering += 1
            wake = self._wake[0]
        try:
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            poller.register(wake, select.POLLIN)
            return any(fd != wake for fd, _ in poller.poll(seconds * 1000))
        finally:
            with self._lock:
                self._lingering -= 1
                if not self._lingering and self._signaled:  # the last one out empties the pipe
                    try:
                        os.read(wake, 64)
                    except BlockingIOError:
                        pass
                    self._signaled = False

    def _signal(self) -> None:
        """(Under the lock.) End every lingering thread's wait."""
        if self._lingering and not self._signaled and self._wake is not None:
            self._signaled = True
            os.write(self._wake[1], b"x")

    def _work(self, job: tuple | None) -> None:
        slot = _Slot()
        try:
            while job is not None:
                _execute(job)
                with self._lock:
                    if self._pending:
                        job = self._pending.popleft()
                        continue
                    if self._shutdown:
                        return
                    self._idle.append(slot)
                slot.wake.acquire()  # until a job (or the shutdown) comes
                job, slot.job = slot.job, None
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new jobs; idle threads end now, busy ones after their job and those pending (or, with
        `cancel_futures`, the pending jobs are cancelled). `wait`: until every thread has ended."""
        with self._lock:
            self._shutdown = True
            self._signal()
            idle, self._idle = self._idle, []
            cancelled = list(self._pending) if cancel_futures else []
            if cancel_futures:
                self._pending.clear()
            threads = list(self._threads)
        for future, *_ in cancelled:
            future.cancel()
        for slot in idle:
            slot.job = None
            slot.wake.release()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _at_exit(self) -> None:
        """At interpreter exit (before its threads are joined): idle threads end, as an executor's do."""
        self.shutdown(wait=False)


def _register_atexit(fn) -> None:
    """`threading._register_atexit` (what concurrent.futures uses: called before the interpreter joins
    its non-daemon threads), so idle threads never hold the exit up."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(fn)
        except RuntimeError:  # the interpreter is already shutting down
            pass
