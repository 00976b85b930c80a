"""A fake OpenAI-compatible embeddings upstream on loopback, run in a thread of the test process.

It checks each request the way the real API would (path, auth header, JSON body shape, input
count, `dimensions` type) and answers 400 like the real one when something is off, records every
request for assertions, and can be scripted to fail (`fail_next(status, ...)`) to exercise the
transient/permanent error handling. Its vectors are deterministic per text — it is a stand-in for
the provider, never used outside tests.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NATIVE_DIMENSIONS = {"text-embedding-3-large": 3072, "text-embedding-3-small": 1536}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: object
    client_port: int = 0  # same port on two requests = one kept-alive connection


@dataclass
class ScriptedFailure:
    status: int
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)
    drop_connection: bool = False


class FakeEmbeddingsServer:
    """`with FakeEmbeddingsServer(api_key="k") as fake: fake.base_url` → http://127.0.0.1:PORT/v1."""

    def __init__(self, api_key: str = "test-key", auth_header: str = "bearer", prefix: str = "/v1",
                 max_inputs: int = 2048, query: str = ""):
        self.api_key = api_key
        self.auth_header = auth_header
        self.prefix = prefix
        self.max_inputs = max_inputs
        self.query = query
        self.requests: list[RecordedRequest] = []
        self._failures: list[ScriptedFailure] = []
        self._lock = threading.Lock()
        self._gate = threading.Event()  # cleared by hold(): requests wait (a worker stuck mid-job)
        self._gate.set()
        self.arrived = threading.Event()  # set when a request arrives while held
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        url = f"http://127.0.0.1:{self._server.server_address[1]}{self.prefix}"
        return url + (f"?{self.query}" if self.query else "")

    def start(self) -> FakeEmbeddingsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._gate.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeEmbeddingsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def hold(self) -> None:
        """Requests from now on wait until release() before they are answered."""
        self.arrived.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def fail_next(self, status: int, body: object = None, headers: dict[str, str] | None = None,
                  times: int = 1, drop_connection: bool = False) -> None:
        with self._lock:
            self._failures.extend(ScriptedFailure(status, body, headers or {}, drop_connection) for _ in range(times))

    @staticmethod
    def vector_for(text: str, dimensions: int) -> list[float]:
        """Deterministic, not unit-length (the client must normalise), never all zero."""
        seed = hashlib.sha256(text.encode()).digest()
        return [((seed[i % 32] + i) % 17) - 8.5 for i in range(dimensions)]

    def _next_failure(self) -> ScriptedFailure | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                fake.requests.append(RecordedRequest("POST", self.path, dict(self.headers.items()), body,
                                                     self.client_address[1]))
                if not fake._gate.is_set():
                    fake.arrived.set()
                    fake._gate.wait(120)
                failure = fake._next_failure()
                if failure and failure.drop_connection:
                    # Really drop it: close() alone leaves the socket open while rfile/wfile hold it.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if failure:
                    return self._send(failure.status, failure.body or _error(f"scripted {failure.status}"),
                                      failure.headers)
                status, answer = fake._answer(self.path, self.headers, body)
                self._send(status, answer)

            def _send(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def _answer(self, path: str, headers, body) -> tuple[int, dict]:
        expected_path = f"{self.prefix}/embeddings" + (f"?{self.query}" if self.query else "")
        if path != expected_path:
            return 404, _error(f"no route {path}", "not_found")
        if self.auth_header == "api-key":
            authorised = headers.get("api-key") == self.api_key and "Authorization" not in headers
        else:
            authorised = headers.get("Authorization") == f"Bearer {self.api_key}"
        if not authorised:
            return 401, _error("Incorrect API key provided", "invalid_api_key")
        if headers.get("Content-Type", "").split(";")[0] != "application/json" or not isinstance(body, dict):
            return 400, _error("body must be a JSON object")
        unknown = set(body) - {"model", "input", "dimensions", "encoding_format", "user"}
        if unknown:
            return 400, _error(f"unknown parameters {sorted(unknown)}")
        model, inputs, dimensions = body.get("model"), body.get("input"), body.get("dimensions")
        if not isinstance(model, str) or not model:
            return 400, _error("model is required")
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) and t for t in inputs):
            return 400, _error("'$.input' is invalid")
        if len(inputs) > self.max_inputs:
            return 400, _error(f"at most {self.max_inputs} inputs per request")
        if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)
                                       or dimensions < 1):
            return 400, _error("dimensions must be a positive integer")
        size = dimensions or NATIVE_DIMENSIONS.get(model, 8)
        # Answer out of order, as the API may: the client must sort by `index`.
        data = [{"object": "embedding", "index": i, "embedding": self.vector_for(t, size)}
                for i, t in reversed(list(enumerate(inputs)))]
        tokens = sum(len(t.split()) for t in inputs)
        return 200, {"object": "list", "data": data, "model": model,
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _error(message: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
