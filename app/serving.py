"""gunicorn worker class whose own error answers use the API's JSON envelope.

gunicorn answers a request it cannot parse (an over-long request line or header field, too many
headers, a malformed header or chunk) itself, before the app sees it, with an HTML page
(`gunicorn.util.write_error`). A client of this API expects the envelope on every answer, so this
worker writes `{"error": {"code", "message"}, "metadata": {"success": false, "timestamp"}}` instead,
with the same status (400, 414, 431, 417, 501…) and `Connection: close`, as gunicorn does.

`docker/gunicorn.conf.py` sets `worker_class = "app.serving.EnvelopeThreadWorker"` (gthread, as
before). gunicorn's `Worker.handle_error` calls the module function `gunicorn.util.write_error`; the
worker points that name at `write_envelope_error` when it starts (`init_process`, in the worker process
only, not in the arbiter), so every gunicorn-level error of this worker uses the envelope. It points
`gunicorn.util.http_date` (the Date header) at `http_date`, which formats the date once a second.

The worker also closes the connection after an answer to a request whose body could not be read
(`closing_wsgi`), saying `Connection: close`.

It also sets `logger_class = "app.serving.AccessLogger"`: gunicorn's logger, whose access line reads
only the atoms its format names (the same line; see the class).

Stopping (SIGTERM): gunicorn's gthread worker stops calling accept() but keeps its listening socket
open until it exits, so a connection made meanwhile completes its handshake in the kernel and waits,
unanswered, until the worker is gone. This worker instead, when it stops: answers every connection the
kernel had already queued for it with a 503 in the envelope (`Connection: close`, `Retry-After`), then
closes its copy of the listening socket (once every process of the server has closed it, new
connections are refused, so a proxy or another instance takes them). A connection it had accepted
whose request has not started yet gets the same 503 (when the server stops); requests already running
finish (the arbiter waits `graceful_timeout`, above the image budget: docker/gunicorn.conf.py). Both
503s happen only when the whole server stops (the arbiter has closed its listening socket): when one
worker is replaced (a reload, max_requests), the other workers take the queued connections and it
serves what it accepted.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from gunicorn import util
from gunicorn.glogging import Logger
from gunicorn.http import message as gunicorn_message
from gunicorn.http import wsgi as gunicorn_wsgi
from gunicorn.http.body import LengthReader
from gunicorn.http.errors import NoMoreData, ParseException
from gunicorn.workers.gthread import TConn, ThreadWorker

from app.observability import logs
from app.threadpool import RecentThreadPool
from app.wire import metadata

_gunicorn_http_date = util.http_date

_CODES = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND", 413: "PAYLOAD_TOO_LARGE"}


def error_code(status: int) -> str:
    """The envelope code of a gunicorn-level answer: the client's fault is INVALID_INPUT (including 501,
    an unsupported transfer coding), a server-side failure SYSTEM_ERROR."""
    if status in _CODES:
        return _CODES[status]
    return "INVALID_INPUT" if status < 500 or status == 501 else "SYSTEM_ERROR"


_date: tuple[int, str] = (-1, "")


def http_date(timestamp: float | None = None) -> str:
    """`gunicorn.util.http_date`, remembered for the current second: the Date header of every response
    formats the time with email.utils.formatdate, which reads whole seconds (the same text)."""
    global _date
    if timestamp is not None:
        return _gunicorn_http_date(timestamp)
    now = time.time()
    second, text = _date
    if int(now) != second:
        text = _gunicorn_http_date(now)
        _date = (int(now), text)  # one tuple: a thread reads the old pair or the new one, never half
    return text


def write_envelope_error(sock, status_int: int, reason: str, mesg: str) -> None:
    message = f"{reason}: {mesg}" if mesg else reason
    body = json.dumps({"error": {"code": error_code(status_int), "message": message[:1000]},
                       "metadata": metadata(False)}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    util.write_nonblock(sock, head + body)


# How long a worker thread spends discarding a body the app did not read (gunicorn's own bound for it)
DRAIN_SECONDS = 5.0
DEFAULT_MAX_BODY = 100 * 1024 * 1024


STOPPING_READ_SECONDS = 5.0  # how long a refused connection may take to send its request head
# How long a worker thread waits, after an answer that keeps the connection, for the client's next request
# before handing the connection back to gunicorn's poller (EnvelopeThreadWorker.handle); 0: never waits.
# The wait gives way as soon as another request needs a thread (RecentThreadPool.linger), so it can be
# long enough for a client that calls every few milliseconds (one request at a time, between other work):
# each request it saves the hand-back through the main thread (~0.3 ms of CPU) and keeps the warm thread
KEEPALIVE_LINGER_SECONDS = float(os.environ.get("GUNICORN_KEEPALIVE_LINGER_MS") or 50) / 1000


def stopping_response() -> bytes:
    """The 503 a stopping worker answers a request it will not start."""
    body = json.dumps({"error": {"code": "SERVICE_UNAVAILABLE",
                                 "message": "The server is shutting down; retry the request."},
                       "metadata": metadata(False)}).encode()
    return (f"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Retry-After: 1\r\nContent-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


def _socket_inodes(pid: int) -> set[int] | None:
    """Inodes of the sockets process `pid` holds open (Linux /proc); None when unknown."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    inodes = set()
    for name in names:
        try:
            link = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def pin_settings(cfg) -> None:
    """Every gunicorn setting read as a plain attribute of `cfg` from now on. gunicorn's `Config` answers
    `cfg.keepalive` through `__getattr__` (a failed lookup, then two calls) and its request path reads
    about 25 settings per request (parser limits, forwarding rules, hooks). A worker process never
    changes its settings (a reload starts new workers from the arbiter's configuration), so in the worker
    each value is put in the instance's dict, where the lookup finds it first: the same values. Names the
    class defines itself (the `is_ssl`, `worker_class`… properties, the methods) are left to the class."""
    cls = type(cfg)
    for name, setting in cfg.settings.items():
        if not hasattr(cls, name):
            cfg.__dict__[name] = setting.get()


_gunicorn_ip_in_allow_list = gunicorn_message._ip_in_allow_list
_ALLOWED_PEERS: dict[tuple, bool] = {}
ALLOWED_PEERS_CACHE_SIZE = 1024


def ip_in_allow_list(ip_str, allow_list, networks) -> bool:
    """gunicorn's `_ip_in_allow_list` (is the peer a trusted proxy: forwarded headers, PROXY protocol),
    remembered per peer address and allow list: gunicorn parses the peer's address with `ipaddress` on
    every request, and behind an ingress the peer is the same few addresses. The networks are made from
    the allow list alone (Config.forwarded_allow_networks / proxy_allow_networks), so the list is the key;
    bounded (cleared when full)."""
    try:
        key = (ip_str, tuple(allow_list))
        found = _ALLOWED_PEERS.get(key)
    except TypeError:  # something unhashable: ask gunicorn
        return _gunicorn_ip_in_allow_list(ip_str, allow_list, networks)
    if found is None:
        found = _gunicorn_ip_in_allow_list(ip_str, allow_list, networks)
        if len(_ALLOWED_PEERS) >= ALLOWED_PEERS_CACHE_SIZE:
            _ALLOWED_PEERS.clear()
        _ALLOWED_PEERS[key] = found
    return found


def _nothing_left(conn) -> bool:
    """Whether the request's body is a Content-Length body read to its end (a GET's empty body included)
    with nothing buffered: draining it would read nothing and answer True, after two socket timeout
    changes (what `finish_body` does for every request)."""
    body = getattr(getattr(getattr(conn, "parser", None), "mesg", None), "body", None)
    reader = getattr(body, "reader", None)
    return (reader.__class__ is LengthReader and reader.length == 0 and body.failed is False
            and body.buf.tell() == 0)


class EnvelopeThreadWorker(ThreadWorker):
    """gthread worker; its gunicorn-level errors are answered in the JSON envelope, an answer after which
    the connection cannot be reused says `Connection: close` and closes it (see `closing_wsgi`), it stops
    listening as soon as it stops (see the module), and a body the app did not read is drained before the
    connection is reused or closed."""

    _stopped_listening = False
    _refusing = False  # the server stops: requests not started yet get the 503

    def init_process(self) -> None:
        pin_settings(self.cfg)
        gunicorn_message._ip_in_allow_list = ip_in_allow_list
        util.write_error = write_envelope_error
        util.http_date = http_date
        gunicorn_wsgi.Response = OneWriteResponse  # what wsgi.create() builds for an HTTP/1 request
        super().init_process()

    def get_thread_pool(self):
        """The request threads, the one that went idle last taking the next connection (app.threadpool);
        GUNICORN_THREAD_POOL=executor: gunicorn's own (concurrent.futures.ThreadPoolExecutor)."""
        if os.environ.get("GUNICORN_THREAD_POOL", "recent") == "executor":
            return super().get_thread_pool()
        return RecentThreadPool(self.cfg.threads, thread_name_prefix="request")

    def run(self) -> None:
        try:
            super().run()
        finally:
            flush = getattr(self.log, "flush_access", None)
            if flush is not None:
                flush()  # the access lines the worker still holds (GUNICORN_ACCESS_LOG_FLUSH_MS)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # read before wrapping: the wrapper is a plain function without the Flask app's config
        config = getattr(self.wsgi, "config", None) or {}
        self.max_body = int(config.get("MAX_CONTENT_LENGTH") or DEFAULT_MAX_BODY)
        self.wsgi = closing_wsgi(self.wsgi)

    def _keepalive_after(self, conn, keepalive):
        """gunicorn discards at most 64 KB of a body the app left unread (a 401, 404, 405 or 429 is
        answered before the body is read), then closes the connection with the rest unread: the kernel
        answers the sender's next bytes with a reset, which can destroy the response on its way. Behind
        an ingress that is still passing the body on, the ingress sees a failed upstream: its client
        gets 502 and the API process is taken out of rotation. So the worker drains up to the largest
        body the app accepts (MAX_CONTENT_LENGTH; a larger one was refused for its Content-Length),
        within the same time bound, whether or not the connection is kept."""
        if _nothing_left(conn):
            return bool(keepalive)
        limit = getattr(self, "max_body", DEFAULT_MAX_BODY) + 65536
        try:
            drained = conn.parser.finish_body(deadline=time.monotonic() + DRAIN_SECONDS, max_bytes=limit)
        except (ParseException, NoMoreData):  # an unread body that is malformed: the connection closes
            return False
        return bool(keepalive and drained)

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive and not self._stopped_listening:
            self._stopped_listening = True
            self.stop_listening()

    def server_stopping(self) -> bool:
        """Whether the whole server stops: the arbiter no longer holds the listening sockets (it closes
        them before it sends SIGTERM to the workers), unlike a reload or one worker's replacement."""
        held = _socket_inodes(self.ppid)
        if held is None:
            return False
        try:
            ours = {os.fstat(listener.fileno()).st_ino for listener in self.sockets}
        except (OSError, AttributeError):
            return False
        return not (ours & held)

    def stop_listening(self) -> None:
        """Answer the connections queued in the kernel (when the server stops), then close this worker's
        copy of every listening socket."""
        self._refusing = self.server_stopping()
        if self._refusing:
            for listener in self.sockets:
                self._refuse_queued(listener)
        for listener in self.sockets:
            listener.close()
        self.log.info("Worker stopping: listening sockets closed")

    def _refuse_queued(self, listener) -> None:
        listener.setblocking(False)
        while True:
            try:
                client, addr = listener.accept()
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    self.log.warning("accepting queued connections while stopping: %s", exc)
                if exc.errno == errno.ECONNABORTED:
                    continue
                return
            client.setblocking(True)
            conn = TConn(self.cfg, client, addr, listener.getsockname())
            self.nr_conns += 1
            self.enqueue_req(conn)  # handle() refuses it: the worker no longer starts requests

    def handle(self, conn):
        """A connection whose request has not started when the server stops gets a 503 (a kept-alive
        connection's next request is served, with `Connection: close`, as gunicorn does; so is every
        accepted request when only this worker is replaced).

        A kept-alive connection whose next request arrives within KEEPALIVE_LINGER_SECONDS is served
        by the same thread (see `_next_request_soon`): gunicorn hands each kept-alive connection back
        to the main thread's poller after every answer (a callback through its method queue, an epoll
        register, then an unregister and a thread-pool submit when the next request arrives), work of
        the same order as the app's own for a small answer."""
        if self._refusing and not conn.initialized:
            self._refuse(conn)
            return False
        while True:
            keepalive = super().handle(conn)
            if keepalive is not True or not self._next_request_soon(conn):
                return keepalive

    def _next_request_soon(self, conn) -> bool:
        """Whether to serve the connection's next request on this thread: the worker is not stopping,
        the connection is a plain HTTP/1 socket, and its next request's bytes are buffered already
        or arrive within KEEPALIVE_LINGER_SECONDS (a thread waits that long at most, in poll(): no CPU).
        Otherwise the connection goes back to gunicorn's poller, as before."""
        if not self.alive or conn.is_http2 or self.cfg.is_ssl or KEEPALIVE_LINGER_SECONDS <= 0:
            return False
        if conn.parser.unreader.buf.getvalue():
            return True  # read ahead (a pipelined request, or a drained body's tail)
        try:
            if isinstance(self.tpool, RecentThreadPool):  # a wait that gives way when a request needs a thread
                return self.tpool.linger(conn.sock, KEEPALIVE_LINGER_SECONDS)
            poller = select.poll()
            poller.register(conn.sock, select.POLLIN)
            return bool(poller.poll(KEEPALIVE_LINGER_SECONDS * 1000))
        except (OSError, ValueError):
            return False

    def _refuse(self, conn) -> None:
        sock = conn.sock
        try:
            sock.setblocking(True)
            sock.settimeout(STOPPING_READ_SECONDS)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:  # the request head, so closing sends no RST
                chunk = sock.recv(8192)
                if not chunk:
                    return
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")[:200]
            sock.sendall(stopping_response())
            self.log.info("Worker stopping: refused %r from %s with 503", line, conn.client)
        except OSError:  # the client went away, or sent no request head in time
            return


class _Captured:
    """A stand-in socket that keeps what is written to it (OneWriteResponse.send_headers)."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


# A body up to this size goes out in the same write as the head (copied once); a larger one after it
ONE_WRITE_MAX_BODY = 256 * 1024


class OneWriteResponse(gunicorn_wsgi.Response):
    """gunicorn's HTTP/1 response, whose head goes out in the same `sendall` as the first body bytes:
    gunicorn writes the status line and headers, then the body, in two system calls (two TCP segments
    for the client to take in), and a JSON answer of this API is one body string. The head is made by
    gunicorn's own `send_headers` (the same bytes) and held until the body's first write, `close()`
    (an answer without body bytes) or a `sendfile`, which sends it first. A chunked answer and a
    body over ONE_WRITE_MAX_BODY are written as gunicorn writes them."""

    _head: bytes | None = None
    _unbuffered = False

    def send_headers(self) -> None:
        if self.headers_sent or self._unbuffered or self.chunked:
            super().send_headers()
            return
        sock, captured = self.sock, _Captured()
        self.sock = captured
        try:
            super().send_headers()
        finally:
            self.sock = sock
        self._head = captured.data

    def _send_head(self) -> None:
        head, self._head = self._head, None
        if head:
            util.write(self.sock, head)

    def _emit_body(self, data: bytes) -> None:
        head = self._head
        if head is not None and not self.chunked and len(data) <= ONE_WRITE_MAX_BODY:
            self._head = None
            util.write(self.sock, head + data)
            return
        self._send_head()
        super()._emit_body(data)

    def sendfile(self, respiter) -> bool:
        self._send_head()
        self._unbuffered = True  # sendfile() writes the head and then the file itself
        return super().sendfile(respiter)

    def close(self) -> None:
        if not self.headers_sent:
            self.send_headers()
        self._send_head()
        super().close()


def closing_wsgi(app):
    """The WSGI app, with gunicorn told to close the connection after an answer when the request's body
    could not be read (gunicorn marks the body `failed`: where the next request would start is unknown)
    or when the app's answer says `Connection: close` (the app's envelope for an unreadable body does).
    gunicorn drops an application's hop-by-hop headers and, without this, announced `keep-alive` and then
    closed the connection anyway; `force_close` makes it send `Connection: close` and mean it."""

    def wsgi(environ, start_response):
        def start(status, headers, exc_info=None):
            resp = getattr(start_response, "__self__", None)  # gunicorn's Response (start_response is its method)
            if resp is not None and (_body_failed(resp) or any(
                    name.lower() == "connection" and value.lower() == "close" for name, value in headers)):
                resp.force_close()
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return wsgi


def _body_failed(resp) -> bool:
    body = getattr(getattr(resp, "req", None), "body", None)
    return bool(getattr(body, "failed", False))


def _status(logger, resp, req, environ, rt):
    status = resp.status
    return status.split(None, 1)[0] if isinstance(status, str) else status


# gunicorn's `Logger.atoms`, one function per atom, so a line computes only the atoms it names
_ATOMS = {
    "h": lambda logger, resp, req, environ, rt: environ.get("REMOTE_ADDR", "-"),
    "l": lambda logger, resp, req, environ, rt: "-",
    "u": lambda logger, resp, req, environ, rt: logger._get_user(environ) or "-",
    "t": lambda logger, resp, req, environ, rt: logger.now(),
    "r": lambda logger, resp, req, environ, rt: (
        f"{environ['REQUEST_METHOD']!s} {environ['RAW_URI']!s} {environ['SERVER_PROTOCOL']!s}"),
    "s": _status,
    "m": lambda logger, resp, req, environ, rt: environ.get("REQUEST_METHOD"),
    "U": lambda logger, resp, req, environ, rt: environ.get("PATH_INFO"),
    "q": lambda logger, resp, req, environ, rt: environ.get("QUERY_STRING"),
    "H": lambda logger, resp, req, environ, rt: environ.get("SERVER_PROTOCOL"),
    "b": lambda logger, resp, req, environ, rt: getattr(resp, "sent", None) is not None and str(resp.sent) or "-",
    "B": lambda logger, resp, req, environ, rt: getattr(resp, "sent", None),
    "f": lambda logger, resp, req, environ, rt: environ.get("HTTP_REFERER", "-"),
    "a": lambda logger, resp, req, environ, rt: environ.get("HTTP_USER_AGENT", "-"),
    "T": lambda logger, resp, req, environ, rt: rt.seconds,
    "D": lambda logger, resp, req, environ, rt: (rt.seconds * 1000000) + rt.microseconds,
    "M": lambda logger, resp, req, environ, rt: (rt.seconds * 1000) + int(rt.microseconds / 1000),
    "L": lambda logger, resp, req, environ, rt: f"{rt.seconds:d}.{rt.microseconds:06d}",
    "p": lambda logger, resp, req, environ, rt: f"<{os.getpid()!s}>",
}
_ABSENT = object()


def _pairs(headers) -> Any:
    headers = getattr(headers, "headers", headers)
    return headers.items() if hasattr(headers, "items") else headers


class LazyAtoms(Mapping):
    """What gunicorn's `SafeAtoms(Logger.atoms(...))` answers for each key, computed when the format
    asks for it: gunicorn builds every atom of every request (all request and response headers and
    the whole WSGI environ, each string escaped) for a line that names six. Same values: a `{name}i`
    / `{name}o` / `{name}e` key is matched lower-cased, the last header of a name wins, a missing key
    is `-`, `"` in a string is escaped. Iterating or testing membership builds gunicorn's own dict."""

    __slots__ = ("_args", "_full")

    def __init__(self, logger, resp, req, environ, request_time) -> None:
        self._args = (logger, resp, req, environ, request_time)
        self._full = None

    def __getitem__(self, key: str):
        logger, resp, req, environ, rt = self._args
        if key.startswith("{"):
            value = self._braced(key.lower())
        else:
            compute = _ATOMS.get(key)
            value = compute(logger, resp, req, environ, rt) if compute is not None else _ABSENT
        if value is _ABSENT:
            return "-"
        return value.replace('"', '\\"') if isinstance(value, str) else value

    def _braced(self, key: str):
        _logger, resp, req, environ, _rt = self._args
        if len(key) < 3 or key[-2] != "}":
            return _ABSENT
        name, kind = key[1:-2], key[-1]
        if kind == "e":
            found = _ABSENT
            for k, v in environ.items():  # keys that differ only in case: the last one, as in the dict
                if k.lower() == name:
                    found = v
            return found
        source = req if kind == "i" else resp if kind == "o" else None
        if source is None:
            return _ABSENT
        found = _ABSENT
        for k, v in _pairs(source):
            if k.lower() == name:
                found = v
        return found

    def _gunicorn(self) -> dict:
        if self._full is None:
            logger = self._args[0]
            self._full = logger.atoms_wrapper_class(logger.atoms(*self._args[1:]))
        return self._full

    def __iter__(self) -> Iterator[str]:
        return iter(self._gunicorn())

    def __len__(self) -> int:
        return len(_ATOMS)  # never 0: logging takes a mapping argument only when it is truthy

    def __contains__(self, key: object) -> bool:
        return key in self._gunicorn()


_PLANS: dict[str, list | None] = {}


def access_plan(fmt: str) -> list | None:
    """`fmt` as a list of (literal text, atom key or None, the atom's function or None), when it is made
    only of text, `%%` and `%(key)s` (every format gunicorn documents); None otherwise (then `%` formats
    it). Remembered per format."""
    if fmt in _PLANS:
        return _PLANS[fmt]
    plan: list | None = []
    literal, i = [], 0
    while i < len(fmt):
        char = fmt[i]
        if char != "%":
            literal.append(char)
            i += 1
        elif fmt.startswith("%%", i):
            literal.append("%")
            i += 2
        elif fmt.startswith("%(", i):
            end = fmt.find(")", i + 2)
            key = fmt[i + 2:end]
            if end < 0 or "(" in key or not fmt.startswith("s", end + 1):
                plan = None
                break
            plan.append(("".join(literal), key, None if key.startswith("{") else _ATOMS.get(key)))
            literal, i = [], end + 2
        else:
            plan = None
            break
    if plan is not None:
        plan.append(("".join(literal), None, None))
    if len(_PLANS) > 64:
        _PLANS.clear()
    _PLANS[fmt] = plan
    return plan


def access_line(fmt: str, atoms: LazyAtoms) -> str:
    """`fmt % atoms`: each atom the format names computed by its function (escaped as `LazyAtoms` does),
    without the `%` operator's mapping lookups through `LazyAtoms.__getitem__`."""
    plan = access_plan(fmt)
    if plan is None:
        return fmt % atoms
    args = atoms._args
    out = []
    for literal, key, compute in plan:
        out.append(literal)
        if key is None:
            continue
        value = compute(*args) if compute is not None else atoms[key]
        if isinstance(value, str):
            out.append(value.replace('"', '\\"') if compute is not None else value)
        else:
            out.append(str(value))
    return "".join(out)


# The most access-line text a worker holds before it writes it out, whatever GUNICORN_ACCESS_LOG_FLUSH_MS says
ACCESS_LOG_BUFFER_BYTES = 64 * 1024


def access_log_flush_seconds() -> float:
    """GUNICORN_ACCESS_LOG_FLUSH_MS in seconds: how long an access line may wait in the worker before it
    is written (0, the default: each line is written and flushed as its request ends)."""
    return max(0.0, float(os.environ.get("GUNICORN_ACCESS_LOG_FLUSH_MS") or 0) / 1000)


class AccessLogger(Logger):
    """gunicorn's logger (error log, access log, reopening, the same settings); its access line is
    formatted from `LazyAtoms` instead of the full atom dict: the same line for the same format.

    With LOG_FORMAT=json (app.observability.logs) both logs write one JSON object per line, and the
    access line has the fields of app.observability.logs.access_fields (the request's route, tenant and
    trace, left in the environ by the app) instead of `access_log_format`.

    With GUNICORN_ACCESS_LOG_FLUSH_MS above 0, the plain access lines (the direct write below) are held
    in the worker and written together, in one write per handler, once the oldest has waited that long
    (a thread of the worker looks every interval), when ACCESS_LOG_BUFFER_BYTES have gathered, when
    the worker exits and before the log files are reopened: what nginx's `access_log … buffer= flush=`
    does. The same bytes in the same order; a line reaches the log up to the interval late (a worker
    killed by SIGKILL loses what it held), so the pipe that carries the log (honcho's relay, a container
    runtime's log driver) wakes once per batch instead of once per request. With LOG_FORMAT=json the JSON
    access line is held the same way (made and formatted when the request ends). The error log is never
    held."""

    json_lines = False
    flush_seconds = 0.0
    _pending: list[str]
    _pending_bytes = 0
    _pending_since = 0.0
    _flusher_pid = 0

    def setup(self, cfg) -> None:
        super().setup(cfg)
        self.json_lines = logs.configured_format() == "json"
        if self.json_lines:
            for handler in (*self.error_log.handlers, *self.access_log.handlers):
                handler.setFormatter(logs.JsonFormatter())
        self.flush_seconds = access_log_flush_seconds()
        self._pending, self._pending_lock, self._flush_lock = [], threading.Lock(), threading.Lock()

    def access(self, resp, req, environ, request_time) -> None:
        if not self.access_log_enabled:
            return
        try:
            if self.json_lines:
                fields = logs.access_fields(resp, environ, request_time)
                args = (fields.get("method"), fields.get("path"), fields.get("status"))
                streams = self._held_streams() if self.flush_seconds > 0 else None
                if streams is None:
                    self.access_log.info("%s %s %s", *args, extra={"access": fields})
                    return
                # held: the record is made and formatted now (its time is the request's end), written later
                record = self.access_log.makeRecord(self.access_log.name, logging.INFO, __file__, 0, "%s %s %s",
                                                    args, None, extra={"access": fields})
                self._hold(streams[0].format(record))
                return
            atoms = LazyAtoms(self, resp, req, environ, request_time)
            streams = self._plain_streams()
            if streams is None:
                self.access_log.info(self.cfg.access_log_format, atoms)
                return
            line = access_line(self.cfg.access_log_format, atoms)
            if self.flush_seconds > 0:
                self._hold(line)
                return
            _write_lines(streams, [line])
        except Exception:
            self.error(traceback.format_exc())

    def _hold(self, line: str) -> None:
        now = time.monotonic()
        with self._pending_lock:
            if self._flusher_pid != os.getpid():  # the first line of this worker process: its flusher
                self._flusher_pid = os.getpid()
                threading.Thread(target=self._flush_every_interval, name="access-log-flush", daemon=True).start()
            if not self._pending:
                self._pending_since = now
            self._pending.append(line)
            self._pending_bytes += len(line)
            due = self._pending_bytes >= ACCESS_LOG_BUFFER_BYTES or now - self._pending_since >= self.flush_seconds
        if due:
            self.flush_access()

    def _flush_every_interval(self) -> None:
        while True:
            time.sleep(self.flush_seconds)
            try:
                self.flush_access()
            except Exception:
                self.error(traceback.format_exc())

    def flush_access(self) -> None:
        """Write the access lines held so far (GUNICORN_ACCESS_LOG_FLUSH_MS), oldest first."""
        if not getattr(self, "_pending", None):
            return
        with self._flush_lock:  # one batch at a time: batches reach the log in the order they were taken
            with self._pending_lock:
                lines, self._pending, self._pending_bytes = self._pending, [], 0
            if not lines:
                return
            streams = self._held_streams()
            if streams is None:  # the handlers changed meanwhile: each line through logging
                for line in lines:
                    self.access_log.info("%s", line)
                return
            _write_lines(streams, lines)

    def _held_streams(self) -> list | None:
        """Where held lines are written: the plain streams (see `_plain_streams`), or with JSON lines the
        same kind of handlers, each with app.observability's JsonFormatter (one line per record, the
        same for every handler), no filters and a level up to INFO. Otherwise None: no holding."""
        if not self.json_lines:
            return self._plain_streams()
        log = self.access_log
        if log.disabled or log.filters or not log.isEnabledFor(logging.INFO) or not log.handlers:
            return None
        for handler in log.handlers:
            kind = type(handler)
            if (kind is not logging.StreamHandler and kind is not logging.FileHandler) or handler.filters \
                    or handler.level > logging.INFO or getattr(handler, "stream", None) is None \
                    or type(handler.formatter) is not logs.JsonFormatter:
                return None
        return log.handlers

    def reopen_files(self) -> None:
        self.flush_access()  # the lines of before the rotation go to the file being rotated
        super().reopen_files()

    def _plain_streams(self) -> list | None:
        """The access log's handlers when writing the line to them is all that `logging` would do: the
        logger takes INFO and has no filters, and every handler is a StreamHandler or an open
        FileHandler with no filters, a level up to INFO and gunicorn's message-only formatter (what
        gunicorn's setup makes of `accesslog`). Then `access` writes the formatted line (and the
        handler's terminator) to each under the handler's lock, as `StreamHandler.emit` does, without
        a LogRecord, its formatting and the logging module's dispatch. Anything else (syslog, a
        handler or filter added by someone else): None, and the line goes through `logging`."""
        log = self.access_log
        if log.disabled or log.filters or not log.isEnabledFor(logging.INFO):
            return None
        handlers = log.handlers
        for handler in handlers:
            kind = type(handler)
            if (kind is not logging.StreamHandler and kind is not logging.FileHandler) or handler.filters \
                    or handler.level > logging.INFO or getattr(handler, "stream", None) is None:
                return None
            formatter = handler.formatter
            if type(formatter) is not logging.Formatter or formatter._fmt != self.access_fmt \
                    or formatter._style.__class__ is not logging.PercentStyle:
                return None
        return handlers


def _write_lines(handlers, lines: list[str]) -> None:
    """`lines`, each with the handler's terminator, in one write and one flush per handler, under the
    handler's lock (as `StreamHandler.emit` writes one record)."""
    for handler in handlers:
        terminator = handler.terminator
        text = terminator.join(lines) + terminator
        handler.acquire()
        try:
            handler.stream.write(text)
            handler.flush()
        finally:
            handler.release()
