"""gunicorn worker class whose own error answers use the API's JSON envelope.

gunicorn answers a request it cannot parse (an over-long request line or header field, too many
headers, a malformed header or chunk) itself, before the app sees it, with an HTML page
(`gunicorn.util.write_error`). A client of this API expects the envelope on every answer, so this
worker writes `{"error": {"code", "message"}, "metadata": {"success": false, "timestamp"}}` instead,
with the same status (400, 414, 431, 417, 501…) and `Connection: close`, as gunicorn does.

`docker/gunicorn.conf.py` sets `worker_class = "app.serving.EnvelopeThreadWorker"` (gthread, as
before). gunicorn's `Worker.handle_error` calls the module function `gunicorn.util.write_error`; the
worker points that name at `write_envelope_error` when it starts (`init_process`, in the worker process
only, not in the arbiter), so every gunicorn-level error of this worker uses the envelope.
"""

from __future__ import annotations

import json

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from app.wire import metadata

_CODES = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND", 413: "PAYLOAD_TOO_LARGE"}


def error_code(status: int) -> str:
    """The envelope code of a gunicorn-level answer: the client's fault is INVALID_INPUT (including 501,
    an unsupported transfer coding), a server-side failure SYSTEM_ERROR."""
    if status in _CODES:
        return _CODES[status]
    return "INVALID_INPUT" if status < 500 or status == 501 else "SYSTEM_ERROR"


def write_envelope_error(sock, status_int: int, reason: str, mesg: str) -> None:
    message = f"{reason}: {mesg}" if mesg else reason
    body = json.dumps({"error": {"code": error_code(status_int), "message": message[:1000]},
                       "metadata": metadata(False)}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    util.write_nonblock(sock, head + body)


class EnvelopeThreadWorker(ThreadWorker):
    """gthread worker; its gunicorn-level errors are answered in the JSON envelope."""

    def init_process(self) -> None:
        util.write_error = write_envelope_error
        super().init_process()
