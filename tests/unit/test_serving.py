"""app.serving: gunicorn's access line from `LazyAtoms` is the line gunicorn's own atoms give."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger, SafeAtoms
from hypothesis import given, settings
from hypothesis import strategies as st

from app.serving import (
    ONE_WRITE_MAX_BODY,
    AccessLogger,
    LazyAtoms,
    OneWriteResponse,
    access_line,
    access_plan,
    ip_in_allow_list,
    pin_settings,
)


def _exchange(status="200 OK", sent=1234, extra_environ=None):
    req = SimpleNamespace(headers=[("HOST", "api"), ("AUTHORIZATION", "Bearer x.y.z"), ("X-REQUEST-ID", "in-1"),
                                   ("X-QUOTE", 'say "hi"'), ("X-TWICE", "first"), ("X-TWICE", "second")])
    resp = SimpleNamespace(status=status, sent=sent,
                           headers=[("Content-Type", "application/json"), ("X-Request-ID", "rid-42"),
                                    ("Vary", "Origin"), ("Vary", "Accept")])
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": "/api/v1/me?a=\"b\"", "SERVER_PROTOCOL": "HTTP/1.1",
               "PATH_INFO": "/api/v1/me", "QUERY_STRING": 'a="b"', "REMOTE_ADDR": "10.0.0.7",
               "HTTP_USER_AGENT": "wrk", "HTTP_AUTHORIZATION": "Bearer x.y.z", "wsgi.url_scheme": "http",
               "wsgi.multithread": True, **(extra_environ or {})}
    return resp, req, environ, timedelta(seconds=2, microseconds=345678)


def _logger(cls):
    logger = cls(Config())
    logger.now = lambda: "[24/Nov/2026:01:02:03 +0000]"  # the one atom that reads the clock
    return logger


@pytest.mark.parametrize("exchange", [
    _exchange(),
    _exchange(status=404, sent=None),  # an int status, nothing sent
    _exchange(extra_environ={"HTTP_AUTHORIZATION": "Basic YWRhOnNlY3JldA=="}),  # %(u)s: basic auth user
])
def test_every_atom_is_the_one_gunicorn_gives(exchange):
    logger = _logger(Logger)
    expected = SafeAtoms(logger.atoms(*exchange))
    lazy = LazyAtoms(logger, *exchange)
    keys = [*expected, "{X-Request-ID}o", "{x-twice}I", "{Vary}o", "{REQUEST_METHOD}e", "{missing}i", "{x}",
            "{}o", "nope", "{x-request-id}x", "S", "{wsgi.multithread}e"]
    for key in keys:
        assert lazy[key] == expected[key], key
    assert set(lazy) == set(expected) and ("s" in lazy) == ("s" in expected) and len(lazy) > 0


def test_the_configured_access_line_is_gunicorns_line():
    """The line docker/gunicorn.conf.py configures, written by both loggers into one list."""
    fmt = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s %(a)s %(u)s %(t)s %({x-quote}i)s'
    lines = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    for cls in (Logger, AccessLogger):
        logger = _logger(cls)
        logger.cfg.set("access_log_format", fmt)
        logger.cfg.set("accesslog", "-")
        logger.setup(logger.cfg)
        logger.access_log.handlers[:] = [Collect()]
        logger.access(*_exchange())
    assert lines[0] == lines[1]
    assert lines[1].startswith('10.0.0.7 "GET /api/v1/me?a=\\"b\\" HTTP/1.1" 200 1234 2345ms rid=rid-42 wrk - ')


def test_the_access_line_written_to_gunicorns_own_handler_is_the_line_logging_writes(tmp_path):
    """gunicorn's own access handler (a file here, stdout with `accesslog = "-"`) gets the line from
    AccessLogger's direct write: the same bytes as gunicorn's Logger through `logging`, request after
    request; a handler gunicorn did not set up (a filter on it) sends the line through `logging`."""
    fmt = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s %(a)s %(t)s %({x-quote}i)s'
    written = {}
    for cls in (Logger, AccessLogger):
        path = tmp_path / f"{cls.__name__}.log"
        logger = _logger(cls)
        logger.cfg.set("access_log_format", fmt)
        logger.cfg.set("accesslog", str(path))
        logger.setup(logger.cfg)
        for exchange in (_exchange(), _exchange(status=404, sent=None)):
            logger.access(*exchange)
        if cls is AccessLogger:
            assert logger._plain_streams() is not None  # the direct write was taken
            handler = logger.access_log.handlers[0]
            seen = []
            handler.addFilter(lambda record, seen=seen: seen.append(record) or True)
            assert logger._plain_streams() is None
            logger.access(*_exchange())
            assert len(seen) == 1  # through logging: the filter saw the record
            handler.filters.clear()
        for handler in logger.access_log.handlers:
            handler.close()
        logger.access_log.handlers.clear()
        written[cls] = path.read_text()
    lines = written[AccessLogger].splitlines()
    assert written[Logger].splitlines() == lines[:2] and lines[2] == lines[0]
    assert lines[1].startswith('10.0.0.7 "GET /api/v1/me?a=\\"b\\" HTTP/1.1" 404 - 2345ms rid=rid-42 wrk ')


def test_held_access_lines_are_the_same_bytes_written_together(tmp_path, monkeypatch):
    """GUNICORN_ACCESS_LOG_FLUSH_MS: the lines wait in the worker and go out together, oldest first, the
    same bytes as line by line; when the oldest has waited the interval, when the buffer is full, on
    `flush_access` (the worker's exit) and before a reopen. Without the setting nothing waits."""
    from app import serving

    fmt = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s'
    exchanges = [_exchange(), _exchange(status=404, sent=None), _exchange(status="201 Created", sent=7)]

    def logger_to(path, flush_ms):
        monkeypatch.setenv("GUNICORN_ACCESS_LOG_FLUSH_MS", flush_ms)
        logger = _logger(AccessLogger)
        logger.access_log.handlers.clear()  # gunicorn's loggers are global: what earlier tests left on it
        logger.cfg.set("access_log_format", fmt)
        logger.cfg.set("accesslog", str(path))
        logger.setup(logger.cfg)
        assert logger._plain_streams() is not None
        return logger

    direct = logger_to(tmp_path / "direct.log", "")
    assert direct.flush_seconds == 0
    for exchange in exchanges:
        direct.access(*exchange)
    expected = (tmp_path / "direct.log").read_text()
    assert len(expected.splitlines()) == 3

    held_path = tmp_path / "held.log"
    held = logger_to(held_path, "60000")
    assert held.flush_seconds == 60
    writes = []
    stream = held.access_log.handlers[0].stream
    real_write = stream.write
    monkeypatch.setattr(stream, "write", lambda text: writes.append(text) or real_write(text), raising=False)
    for exchange in exchanges:
        held.access(*exchange)
    assert held_path.read_text() == "" and writes == []  # held: nothing written yet
    held.flush_access()
    assert held_path.read_text() == expected and len(writes) == 1  # one write, the same bytes
    held.flush_access()
    assert len(writes) == 1  # nothing held: nothing written

    held.access(*exchanges[0])
    held.reopen_files()  # the held line goes to the file before it is reopened
    assert held_path.read_text() == expected + expected.splitlines(keepends=True)[0]

    monkeypatch.setattr(serving, "ACCESS_LOG_BUFFER_BYTES", 1)  # full at once: written at the first line
    held.access(*exchanges[1])
    assert held_path.read_text().endswith(expected.splitlines(keepends=True)[1])

    monkeypatch.setattr(serving, "ACCESS_LOG_BUFFER_BYTES", 1 << 20)
    for handler in held.access_log.handlers:
        handler.close()
    timed_path = tmp_path / "timed.log"
    timed = logger_to(timed_path, "50")  # the worker's flusher thread writes what waited 50 ms, without a request
    timed.access(*exchanges[2])
    deadline = time.monotonic() + 10
    while timed_path.read_text() != expected.splitlines(keepends=True)[2]:
        assert time.monotonic() < deadline, "the held line was not written by the flusher"
        time.sleep(0.02)
    for handler in timed.access_log.handlers:
        handler.close()


def test_held_json_access_lines_are_the_lines_logging_writes(tmp_path, monkeypatch):
    """LOG_FORMAT=json with GUNICORN_ACCESS_LOG_FLUSH_MS: the JSON access line is made when the request
    ends and written with the batch; the same object as through `logging`, the time aside."""
    import json

    monkeypatch.setenv("LOG_FORMAT", "json")
    monkeypatch.setenv("ENV_FILE", "")
    written = {}
    for flush_ms in ("", "60000"):
        monkeypatch.setenv("GUNICORN_ACCESS_LOG_FLUSH_MS", flush_ms)
        path = tmp_path / f"json-{flush_ms or 0}.log"
        logger = _logger(AccessLogger)
        logger.access_log.handlers.clear()
        logger.cfg.set("accesslog", str(path))
        logger.setup(logger.cfg)
        assert logger.json_lines
        for exchange in (_exchange(), _exchange(status=404, sent=None)):
            logger.access(*exchange)
        if flush_ms:
            assert path.read_text() == ""  # held
            logger.flush_access()
        for handler in logger.access_log.handlers:
            handler.close()
        written[flush_ms] = [json.loads(line) for line in path.read_text().splitlines()]
    for entry in (*written[""], *written["60000"]):
        assert entry.pop("time")
    assert written[""] == written["60000"] and len(written[""]) == 2
    assert written[""][1]["status"] == 404 and written[""][0]["logger"] == "gunicorn.access"


def test_pinned_settings_read_the_same_values():
    """A worker's settings as plain attributes: every setting reads as through gunicorn's `__getattr__`,
    the class's own properties and methods still answer, and nothing else of the config changes."""
    cfg = Config()
    cfg.set("keepalive", 7)
    cfg.set("access_log_format", "%(h)s")
    cfg.set("forwarded_allow_ips", "10.0.0.1,127.0.0.1")
    before = {name: getattr(cfg, name) for name in cfg.settings}
    is_ssl, networks = cfg.is_ssl, cfg.forwarded_allow_networks()
    pin_settings(cfg)
    assert {name: getattr(cfg, name) for name in cfg.settings} == before
    assert "keepalive" in vars(cfg) and "worker_class" not in vars(cfg)  # a property of the class: left to it
    assert cfg.keepalive == 7 and cfg.is_ssl == is_ssl and cfg.forwarded_allow_networks() == networks
    assert cfg.worker_class is Config().worker_class


@pytest.mark.parametrize("allow", ["127.0.0.1", "10.0.0.0/8,127.0.0.1", "*", "", "192.168.1.0/24,::1"])
def test_a_remembered_peer_check_is_gunicorns(allow):
    """The trusted-proxy check remembered per (peer, allow list) answers as gunicorn's own, asked twice."""
    from app import serving

    cfg = Config()
    cfg.set("forwarded_allow_ips", allow)
    networks = cfg.forwarded_allow_networks()
    for peer in ("127.0.0.1", "10.1.2.3", "192.168.1.7", "::1", "8.8.8.8", "not-an-ip", ""):
        expected = serving._gunicorn_ip_in_allow_list(peer, cfg.forwarded_allow_ips, networks)
        assert ip_in_allow_list(peer, cfg.forwarded_allow_ips, networks) is expected
        assert ip_in_allow_list(peer, cfg.forwarded_allow_ips, networks) is expected


def test_the_date_header_is_gunicorns_for_every_second(monkeypatch):
    """app.serving.http_date remembers the text of the current second only: the next second, or a
    given timestamp, is formatted afresh, and the text is gunicorn's."""
    from gunicorn import util

    from app import serving

    assert serving._gunicorn_http_date.__module__ == util.__name__  # gunicorn's own, kept before the patch
    for now in (1_800_000_000.1, 1_800_000_000.9, 1_800_000_001.0, 1_800_000_001.5, 1_700_000_000.0):
        monkeypatch.setattr(serving.time, "time", lambda now=now: now)
        assert serving.http_date() == serving._gunicorn_http_date(now)
    assert serving.http_date(1_600_000_000) == serving._gunicorn_http_date(1_600_000_000)


_names = st.text(alphabet="aAbB-_}{İıΣσ\"\\\r\n", max_size=4)
_values = st.text(alphabet='ab"\\\r\n\x00 é', max_size=5)
_keys = st.tuples(st.sampled_from(["{", ""]), _names,
                  st.sampled_from(["}i", "}o", "}e", "}I", "}O", "}E", "", "}", "}x"])).map("".join)


@settings(max_examples=1000, deadline=None)
@given(req=st.lists(st.tuples(_names, _values), max_size=4), resp=st.lists(st.tuples(_names, _values), max_size=4),
       env=st.dictionaries(_names, _values | st.integers() | st.none(), max_size=4), keys=st.lists(_keys, max_size=6),
       status=st.sampled_from(["200 OK", 404, None]), sent=st.sampled_from([None, 0, 12]))
def test_random_headers_environ_and_keys_give_gunicorns_atoms(req, resp, env, keys, status, sent):
    """Names with `}`, case folding beyond ASCII, quotes, CR/LF and NUL in values, repeated names."""
    logger = _logger(Logger)
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": '/a"b', "SERVER_PROTOCOL": "HTTP/1.1", **env}
    exchange = (SimpleNamespace(status=status, sent=sent, headers=resp), SimpleNamespace(headers=req), environ,
                timedelta(seconds=1, microseconds=5))
    expected, lazy = SafeAtoms(logger.atoms(*exchange)), LazyAtoms(logger, *exchange)
    for key in [*keys, *expected]:
        assert lazy[key] == expected[key], key


_pieces = st.one_of(
    st.text(alphabet='ab "%()s{}', max_size=4).filter(lambda t: "%" not in t), st.just("%%"),
    st.sampled_from(["h", "l", "u", "t", "r", "s", "m", "U", "q", "H", "b", "B", "f", "a", "T", "D", "M", "L", "p",
                     "S", "nope", ""]).map(lambda k: f"%({k})s"),
    _keys.filter(lambda k: "(" not in k and ")" not in k).map(lambda k: f"%({k})s"),
    st.sampled_from(["%(h)r", "%(b)d", "%(a(b)s", "%(h", "%", "%(T)05d"]))


@settings(max_examples=1000, deadline=None)
@given(pieces=st.lists(_pieces, max_size=8), env=st.dictionaries(_names, _values, max_size=3),
       status=st.sampled_from(["200 OK", 404, None]), sent=st.sampled_from([None, 0, 12]))
def test_an_access_line_is_the_format_applied_to_gunicorns_atoms(pieces, env, status, sent):
    """`access_line` (the format's atoms computed directly) is `fmt % atoms`, the line before it, and for a
    format it takes apart (text with quotes and `%%`, every atom, braced keys, unknown keys) gunicorn's
    line; another format (another conversion, a key with a parenthesis) is formatted by `%`, with the same
    error where `%` raises."""
    fmt = "".join(pieces)
    logger = _logger(Logger)
    exchange = (SimpleNamespace(status=status, sent=sent, headers=[("X-Q", 'a"b')]),
                SimpleNamespace(headers=[("X-Q", "in")]),
                {"REQUEST_METHOD": "GET", "RAW_URI": '/a"b', "SERVER_PROTOCOL": "HTTP/1.1", **env},
                timedelta(seconds=1, microseconds=5))
    atoms = LazyAtoms(logger, *exchange)
    try:
        before = fmt % atoms
    except (TypeError, ValueError, KeyError) as exc:
        with pytest.raises(type(exc)):
            access_line(fmt, atoms)
        return
    assert access_line(fmt, atoms) == before
    if access_plan(fmt) is not None:
        assert before == fmt % SafeAtoms(logger.atoms(*exchange))


def test_the_shipped_access_format_is_taken_apart():
    """docker/gunicorn.conf.py's format takes the direct path (no `%` through the atoms mapping)."""
    plan = access_plan('%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s')
    assert plan is not None and [key for _text, key, _f in plan] == ["h", "r", "s", "b", "M", "{x-request-id}o", None]


class _Response:
    """Stands in for gunicorn's Response: `start_response` is its bound method."""

    def __init__(self, body_failed: bool):
        self.req = SimpleNamespace(body=SimpleNamespace(failed=body_failed))
        self.closed, self.started = False, None

    def force_close(self):
        self.closed = True

    def start_response(self, status, headers, exc_info=None):
        self.started = (status, headers)


@pytest.mark.parametrize("body_failed, headers, closes", [
    (False, [("Content-Type", "application/json")], False),
    (True, [("Content-Type", "application/json")], True),  # gunicorn marked the body unreadable
    (False, [("Connection", "close")], True),  # the app says so (its envelope for an unreadable body)
])
def test_closing_wsgi_closes_after_an_unreadable_body(body_failed, headers, closes):
    from app.serving import closing_wsgi

    def app(environ, start_response):
        start_response("400 BAD REQUEST", headers)
        return [b"{}"]

    resp = _Response(body_failed)
    assert closing_wsgi(app)({}, resp.start_response) == [b"{}"]
    assert resp.closed is closes and resp.started == ("400 BAD REQUEST", headers)

def test_a_worker_answers_queued_connections_only_when_the_whole_server_stops():
    """`server_stopping`: the arbiter (the worker's parent) closes its listening sockets before it sends
    SIGTERM to the workers on a stop; on a reload or one worker's replacement it keeps them, and the
    other workers take the queued connections (no 503)."""
    import socket
    import subprocess
    import sys

    from app.serving import EnvelopeThreadWorker

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    code = "import sys; sys.stdin.read()"
    holding = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, pass_fds=[listener.fileno()])
    released = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        worker = SimpleNamespace(sockets=[listener], ppid=holding.pid)
        assert EnvelopeThreadWorker.server_stopping(worker) is False
        worker.ppid = released.pid
        assert EnvelopeThreadWorker.server_stopping(worker) is True
    finally:
        for proc in (holding, released):
            proc.communicate(b"", timeout=30)
        listener.close()


def test_the_drain_bound_follows_the_apps_max_content_length(monkeypatch):
    """The worker drains an unread body up to the app's MAX_CONTENT_LENGTH (read before the app is
    wrapped by `closing_wsgi`, a plain function without the config), and a malformed unread body
    closes the connection instead of raising."""
    from gunicorn.http.errors import InvalidChunkSize
    from gunicorn.workers.gthread import ThreadWorker

    from app.serving import EnvelopeThreadWorker

    app = SimpleNamespace(config={"MAX_CONTENT_LENGTH": 500 * 1024 * 1024})
    monkeypatch.setattr(ThreadWorker, "load_wsgi", lambda self: setattr(self, "wsgi", app))
    worker = EnvelopeThreadWorker.__new__(EnvelopeThreadWorker)
    worker.load_wsgi()
    asked = {}

    def finish_body(deadline=None, max_bytes=None):
        asked["max_bytes"] = max_bytes
        return True

    conn = SimpleNamespace(parser=SimpleNamespace(finish_body=finish_body))
    assert worker._keepalive_after(conn, True) is True
    assert asked["max_bytes"] == 500 * 1024 * 1024 + 65536

    def malformed(deadline=None, max_bytes=None):
        raise InvalidChunkSize(b"ZZ")

    assert worker._keepalive_after(SimpleNamespace(parser=SimpleNamespace(finish_body=malformed)), True) is False


def test_a_body_read_to_its_end_is_not_drained_and_any_other_is():
    """`_keepalive_after` skips gunicorn's drain (two socket timeout changes and a read of nothing) only
    for a Content-Length body read to its end with nothing buffered: the answer drain would give."""
    import io

    from gunicorn.http.body import Body, ChunkedReader, LengthReader

    from app.serving import EnvelopeThreadWorker

    worker = EnvelopeThreadWorker.__new__(EnvelopeThreadWorker)
    calls = []

    def conn_with(body):
        def finish_body(deadline=None, max_bytes=None):
            calls.append(body)
            return True
        return SimpleNamespace(parser=SimpleNamespace(mesg=SimpleNamespace(body=body), finish_body=finish_body))

    empty = Body(LengthReader(None, 0))
    assert worker._keepalive_after(conn_with(empty), True) is True
    assert worker._keepalive_after(conn_with(empty), False) is False
    assert calls == []
    unread = Body(LengthReader(None, 5))
    failed = Body(LengthReader(None, 0))
    failed.failed = True
    buffered = Body(LengthReader(None, 0))
    buffered.buf = io.BytesIO()
    buffered.buf.write(b"rest")
    chunked = Body(ChunkedReader(SimpleNamespace(), None))
    for body in (unread, failed, buffered, chunked):
        worker._keepalive_after(conn_with(body), True)
    assert calls == [unread, failed, buffered, chunked]


class _Sock:
    def __init__(self):
        self.writes = []

    def sendall(self, data):
        self.writes.append(bytes(data))


def _answer(cls, method="GET", status="200 OK", headers=(("Content-Type", "application/json"),), body=(b"{}",),
            version=(1, 1)):
    from gunicorn.http.wsgi import Response

    assert issubclass(cls, Response)
    req = SimpleNamespace(version=version, method=method, should_close=lambda: False)
    sock = _Sock()
    resp = cls(req, sock, Config())
    resp.start_response(status, list(headers))
    for chunk in body:
        resp.write(chunk)
    resp.close()
    return sock.writes


@pytest.mark.parametrize("case", [
    {},  # the usual JSON answer: head and body in one write
    {"headers": (("Content-Length", "2"),)},
    {"body": ()},  # no body bytes at all: the head on close
    {"method": "HEAD", "headers": (("Content-Length", "2"),)},  # no body permitted
    {"status": "304 Not Modified", "body": (b"",)},
    {"body": (b"[", b"1", b"]")},  # several writes: the head with the first
    {"body": (b"x" * (ONE_WRITE_MAX_BODY + 1),)},  # a large body after the head, as gunicorn does
    {"version": (1, 1), "headers": (("Content-Type", "text/plain"),), "body": (b"a", b"bc")},  # chunked
    {"version": (1, 0)},
])
def test_a_response_sends_gunicorns_bytes_with_the_head_in_the_first_body_write(case, monkeypatch):
    from gunicorn import util
    from gunicorn.http.wsgi import Response

    monkeypatch.setattr(util, "http_date", lambda *a: "Thu, 26 Nov 2026 10:00:00 GMT")
    theirs, ours = _answer(Response, **case), _answer(OneWriteResponse, **case)
    assert b"".join(ours) == b"".join(theirs)
    chunked = b"Transfer-Encoding: chunked" in theirs[0]
    if not chunked and len(b"".join(theirs)) - len(theirs[0]) <= ONE_WRITE_MAX_BODY:
        assert len(ours) == max(1, len(theirs) - 1)  # the head joined the first body write
