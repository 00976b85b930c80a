"""Test doubles for image generation that speak real wire protocols, all on loopback.

- `FakeAzureImages` / `FakeImagen`: threads in the test process serving provider-a / provider-b's
  HTTP API. Each checks every request the way the real API would (path, api-version, auth header,
  body or multipart parts) and answers 400 "FakeRejected" plus a recorded violation otherwise; a
  test scripts the answer with `fake.reply(...)`.
- `TlsImageServer` + `LoopbackNet`: an HTTPS server for reference URLs with a throwaway
  certificate, and the resolver/connector/policy the fetcher is given in tests. The policy is the
  production policy plus exactly 127.0.0.1, and the connector refuses to open anything else.
"""

from __future__ import annotations

import base64
import datetime
import io
import ipaddress
import json
import re
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from PIL import Image

from app.images.fetcher import public_address_allowed

LOOPBACK = ipaddress.ip_address("127.0.0.1")


# -- images --------------------------------------------------------------------------------------

def png_bytes(width=64, height=48, color=(200, 30, 30, 255), mode="RGBA") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), color if mode != "RGB" else color[:3]).save(buf, "PNG")
    return buf.getvalue()


def jpeg_bytes(width=64, height=48, color=(10, 120, 200)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def mask_bytes(width=64, height=48) -> bytes:
    """A real inpainting mask: opaque, with a transparent (alpha 0) rectangle to repaint."""
    img = Image.new("RGBA", (width, height), (0, 0, 0, 255))
    img.paste((0, 0, 0, 0), (width // 4, height // 4, width // 2, height // 2))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# -- fake upstreams ------------------------------------------------------------------------------

@dataclass
class Received:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    json: Any = None
    parts: dict[str, tuple[bytes, str | None]] = field(default_factory=dict)  # name -> (bytes, content type)


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop_connection: bool = False


class _FakeServer:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.violations: list[str] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                fake._handle(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> None:
        with self._lock:
            self.received.clear()
            self.violations.clear()
            self._replies.clear()

    def reply(self, *replies: Reply) -> None:
        """Queue answers for the next requests (after them: the default success answer)."""
        with self._lock:
            self._replies.extend(replies)

    def _next_reply(self, request: Received) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.pop(0)
        return self.success(request)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length)
        split = urlsplit(handler.path)
        request = Received("POST", split.path, parse_qs(split.query), dict(handler.headers.items()), body)
        problems = self.check(request)
        with self._lock:
            self.received.append(request)
            self.violations.extend(problems)
        reply = Reply(400, {"error": {"code": "FakeRejected", "message": "; ".join(problems)}}) if problems \
            else self._next_reply(request)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.drop_connection:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body or {}).encode()
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in reply.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        try:
            handler.wfile.write(data)
        except OSError:
            pass  # the client gave up (timeout tests)

    def check(self, request: Received) -> list[str]:
        raise NotImplementedError

    def success(self, request: Received) -> Reply:
        raise NotImplementedError


def _parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None]]:
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    parts = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        ctype = part.get_content_type() if part.get("Content-Type") else None
        parts[name] = (part.get_payload(decode=True), ctype)
    return parts


class FakeAzureImages(_FakeServer):
    """provider-a (Azure OpenAI images, deployment routes)."""

    API_KEY = "test-azure-key"
    GENERATION_VERSION = "2025-04-01-preview"
    EDIT_VERSION = "2025-06-01-preview"
    LEGACY = {"legacy-images", "dall-e-3"}
    _PATH = re.compile(r"^/openai/deployments/([^/]+)/images/(generations|edits)$")
    GENERAL_KEYS = {"prompt", "size", "quality", "n", "output_format", "background", "moderation"}
    LEGACY_KEYS = {"prompt", "size", "quality", "n", "style", "response_format"}

    def __init__(self) -> None:
        super().__init__()
        self.image = png_bytes(96, 64)
        self.known_deployments = {"gpt-image-1", "legacy-images", "dall-e-3"}

    def check(self, r: Received) -> list[str]:
        problems = []
        match = self._PATH.match(r.path)
        if not match:
            return [f"unexpected path {r.path}"]
        deployment, operation = match.groups()
        expected = self.EDIT_VERSION if operation == "edits" else self.GENERATION_VERSION
        if r.query.get("api-version") != [expected]:
            problems.append(f"api-version {r.query.get('api-version')} != {expected}")
        if r.headers.get("api-key") != self.API_KEY:
            problems.append("missing or wrong api-key header")
        if "Authorization" in r.headers:
            problems.append("unexpected Authorization header")
        if operation == "generations":
            problems += self._check_generation(r, deployment)
        else:
            problems += self._check_edit(r, deployment)
        return problems

    def _check_generation(self, r: Received, deployment: str) -> list[str]:
        if not r.headers.get("Content-Type", "").startswith("application/json"):
            return ["generation body is not JSON"]
        r.json = json.loads(r.body)
        problems = []
        if "model" in r.json:
            problems.append("model field on a deployment route")
        allowed = self.LEGACY_KEYS if deployment in self.LEGACY else self.GENERAL_KEYS
        if set(r.json) - allowed:
            problems.append(f"unexpected fields {sorted(set(r.json) - allowed)}")
        if r.json.get("n") != 1 or not r.json.get("prompt"):
            problems.append("n must be 1 and prompt present")
        if deployment in self.LEGACY and r.json.get("response_format") != "b64_json":
            problems.append("legacy call without response_format=b64_json")
        return problems

    def _check_edit(self, r: Received, deployment: str) -> list[str]:
        ctype = r.headers.get("Content-Type", "")
        if not ctype.startswith("multipart/form-data"):
            return ["edit body is not multipart"]
        if deployment in self.LEGACY:
            return ["edit on a legacy deployment"]
        r.parts = _parse_multipart(ctype, r.body)
        problems = []
        if set(r.parts) - {"image", "mask", "prompt", "size", "quality", "n"}:
            problems.append(f"unexpected parts {sorted(r.parts)}")
        if "model" in r.parts:
            problems.append("model part on a deployment route")
        image = r.parts.get("image", (b"", None))
        if image[1] not in ("image/png", "image/jpeg") or not image[0]:
            problems.append("image part missing or not png/jpeg")
        if "mask" in r.parts and not r.parts["mask"][0].startswith(b"\x89PNG"):
            problems.append("mask part is not a PNG")
        if not r.parts.get("prompt", (b"",))[0]:
            problems.append("prompt part missing")
        return problems

    def success(self, r: Received) -> Reply:
        deployment = self._PATH.match(r.path).group(1)
        if deployment not in self.known_deployments:
            return Reply(404, {"error": {"code": "DeploymentNotFound",
                                         "message": "The API deployment for this resource does not exist."}})
        body: dict[str, Any] = {"created": int(time.time()),
                                "data": [{"b64_json": b64(self.image), "revised_prompt": "a revised prompt"}]}
        if deployment not in self.LEGACY:
            body["usage"] = {"input_tokens": 50, "output_tokens": 4160, "total_tokens": 4210,
                             "input_tokens_details": {"text_tokens": 50, "image_tokens": 0}}
        return Reply(200, body)


class FakeImagen(_FakeServer):
    """provider-b (Vertex AI Imagen predict), plus an OAuth token endpoint for service accounts."""

    PROJECT, LOCATION = "test-project", "us-central1"
    STATIC_TOKEN = "static-vertex-token"
    _PATH = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/google/models/([^/:]+):predict$")
    RATIOS = {"1:1", "3:4", "4:3", "9:16", "16:9"}

    def __init__(self) -> None:
        super().__init__()
        self.image = jpeg_bytes(80, 60)
        self.accepted_tokens = {self.STATIC_TOKEN}
        self.issued_tokens: list[str] = []
        self.known_models = {"imagen-3.0-generate-002", "imagen-3.0-capability-001", "imagen-4.0-generate-001"}

    def reset(self) -> None:
        super().reset()
        self.issued_tokens.clear()
        self.accepted_tokens = {self.STATIC_TOKEN}

    def check(self, r: Received) -> list[str]:
        if r.path == "/token":
            return self._check_token_request(r)
        match = self._PATH.match(r.path)
        if not match:
            return [f"unexpected path {r.path}"]
        project, location, _model = match.groups()
        problems = []
        if (project, location) != (self.PROJECT, self.LOCATION):
            problems.append(f"wrong project/location {project}/{location}")
        auth = r.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.accepted_tokens:
            problems.append("missing or unknown bearer token")
        try:
            r.json = json.loads(r.body)
        except ValueError:
            return problems + ["body is not JSON"]
        problems += self._check_body(r.json)
        return problems

    def _check_body(self, body: Any) -> list[str]:
        problems = []
        if set(body) != {"instances", "parameters"}:
            problems.append(f"top-level keys {sorted(body)}")
        instances = body.get("instances") or []
        if len(instances) != 1 or not instances[0].get("prompt"):
            problems.append("exactly one instance with a prompt expected")
        for ref in (instances[0].get("referenceImages") or []) if instances else []:
            if ref.get("referenceType") != "REFERENCE_TYPE_RAW" or ref.get("referenceId") != 1:
                problems.append("reference image is not RAW id 1")
            if base64.b64decode(ref.get("referenceImage", {}).get("bytesBase64Encoded", ""))[:3] not in (
                    b"\x89PN", b"\xff\xd8\xff"):
                problems.append("reference bytes are not an image")
        params = body.get("parameters") or {}
        if params.get("sampleCount") != 1:
            problems.append("sampleCount must be 1")
        if params.get("aspectRatio") not in self.RATIOS:
            problems.append(f"aspectRatio {params.get('aspectRatio')}")
        if "model" in params or "quality" in params or "style" in params:
            problems.append("fields Imagen does not take")
        return problems

    def _check_token_request(self, r: Received) -> list[str]:
        form = parse_qs(r.body.decode())
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"] or not form.get("assertion"):
            return ["token request is not a JWT bearer grant"]
        import jwt

        claims = jwt.decode(form["assertion"][0], options={"verify_signature": False})
        if "https://www.googleapis.com/auth/cloud-platform" not in claims.get("scope", ""):
            return ["token request without cloud-platform scope"]
        return []

    def success(self, r: Received) -> Reply:
        if r.path == "/token":
            token = f"sa-token-{len(self.issued_tokens) + 1}"
            self.issued_tokens.append(token)
            self.accepted_tokens.add(token)
            return Reply(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})
        model = self._PATH.match(r.path).group(3)
        if model not in self.known_models:
            return Reply(404, {"error": {"code": 404, "status": "NOT_FOUND",
                                         "message": f"Publisher Model `{model}` not found."}})
        return Reply(200, {"predictions": [{"bytesBase64Encoded": b64(self.image), "mimeType": "image/jpeg"}]})


def service_account_file(token_uri: str) -> str:
    """A service-account JSON with a fresh RSA key whose token_uri is the fake's /token."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": FakeImagen.PROJECT, "private_key_id": "k1",
            "private_key": pem, "client_email": "imagen@test-project.iam.gserviceaccount.com",
            "client_id": "1", "token_uri": token_uri}
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(info, handle)
    handle.close()
    return handle.name


# -- reference URL server and loopback network ---------------------------------------------------

def _self_signed(names: list[str]) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class TlsImageServer:
    """HTTPS on 127.0.0.1 with scripted paths (good images, lies, drips, redirects)."""

    NAMES = ["cdn.example.com", "images.example.com", "internal.example.com", "evil.example.org"]

    def __init__(self) -> None:
        self.cert_pem, key_pem = _self_signed(self.NAMES)
        self.png = png_bytes(64, 48)
        self.jpeg = jpeg_bytes(64, 48)
        self.mask = mask_bytes(64, 48)
        self.drip_interval = 0.2
        self.hits: list[tuple[str, str]] = []  # (Host header, path)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                server.hits.append((self.headers.get("Host", ""), self.path))
                server.route(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as fh:
            fh.write(self.cert_pem + key_pem)
        context.load_cert_chain(fh.name)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.cert_pem.decode())

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def route(self, h: BaseHTTPRequestHandler) -> None:  # noqa: C901 (a script of cases)
        path = h.path.split("?")[0]
        if path == "/ok.png":
            return self._send(h, 200, self.png, "image/png")
        if path == "/ok.jpg":
            return self._send(h, 200, self.jpeg, "image/jpeg")
        if path == "/mask.png":
            return self._send(h, 200, self.mask, "image/png")
        if path == "/html-as-png":
            return self._send(h, 200, b"<html><body>not an image</body></html>", "image/png")
        if path == "/truncated.png":
            return self._send(h, 200, self.png[:60], "image/png")
        if path == "/not-found":
            return self._send(h, 404, b"nope", "text/plain")
        if path == "/gzip":
            return self._send(h, 200, self.png, "image/png", {"Content-Encoding": "gzip"})
        big = {"/big-honest": ({"Content-Length": str(25 * 1024 * 1024)}, 25 * 1024 * 1024),
               "/big-chunked": ({"Connection": "close"}, 21 * 1024 * 1024),  # no length at all
               "/big-lying": ({"Content-Length": "2048"}, 21 * 1024 * 1024)}  # claims 2 KB
        if path in big:
            headers, total = big[path]
            h.send_response(200)
            h.send_header("Content-Type", "image/png")
            for key, value in headers.items():
                h.send_header(key, value)
            h.end_headers()
            h.close_connection = True
            return self._stream(h, total, prefix=self.png[:8])
        if path == "/drip-headers":  # the status line, then one header byte per interval
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for byte in b"Content-Type: image/png\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n":
                try:
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
                except OSError:
                    return
                time.sleep(self.drip_interval)
            h.close_connection = True
            return
        if path == "/drip":
            h.send_response(200)
            h.send_header("Content-Type", "image/png")
            h.send_header("Content-Length", str(len(self.png)))
            h.end_headers()
            for i in range(len(self.png)):
                try:
                    h.wfile.write(self.png[i:i + 1])
                    h.wfile.flush()
                except OSError:
                    return
                time.sleep(self.drip_interval)
            return
        if path.startswith("/redirect"):
            target = dict(p.split("=", 1) for p in (urlsplit(h.path).query or "").split("&") if "=" in p)
            return self._send(h, 302, b"", "text/plain", {"Location": target.get("to", "/ok.png")})
        if path.startswith("/loop"):
            n = int(path[len("/loop"):] or 0)
            return self._send(h, 302, b"", "text/plain", {"Location": f"/loop{n + 1}"})
        return self._send(h, 404, b"", "text/plain")

    @staticmethod
    def _send(h, status, body, ctype, headers=None):
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()
        h.wfile.write(body)

    @staticmethod
    def _stream(h, total, prefix=b""):
        chunk = b"\0" * 65536
        try:
            h.wfile.write(prefix)
            sent = len(prefix)
            while sent < total:
                h.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass


class LoopbackNet:
    """The fetcher's injected network: names -> scripted answers; connections only to 127.0.0.1."""

    def __init__(self, server_port: int, answers: dict[str, list[str]] | None = None) -> None:
        self.server_port = server_port
        self.answers = answers if answers is not None else {}
        self.lookups: list[str] = []
        self.connections: list[tuple[str, int]] = []

    def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        if host not in self.answers:
            raise socket.gaierror(f"no such name in the test resolver: {host}")
        return list(self.answers[host])

    def connect(self, address: str, port: int, timeout: float) -> socket.socket:
        self.connections.append((address, port))
        if ipaddress.ip_address(address) != LOOPBACK or port != 443:
            raise AssertionError(f"fetcher tried to connect to {address}:{port}")
        return socket.create_connection(("127.0.0.1", self.server_port), timeout=timeout)

    @staticmethod
    def policy(address) -> bool:
        """TEST ONLY: the production policy, plus the one loopback address the test server uses."""
        return address == LOOPBACK or public_address_allowed(address)


# -- GCS emulator --------------------------------------------------------------------------------

class GcsEmulator:
    """`gcp-storage-emulator` (a real GCS JSON API) in a thread on loopback, in memory."""

    def __init__(self, bucket: str = "platform-images") -> None:
        import logging

        from gcp_storage_emulator.server import create_server

        logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
        self.bucket = bucket
        self.server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.server._api._httpd.server_address[1]}"

    def close(self) -> None:
        self.server.stop()


# -- SSRF cases the fetcher must refuse (unit tests of the fetcher, and the same through the API) ----

TEXT_CASES = [
    "http://cdn.example.com/ok.png", "file:///etc/passwd", "data:image/png;base64,iVBORw0KGgo=",
    "ftp://cdn.example.com/ok.png", "gopher://cdn.example.com/", "javascript:alert(1)", "//cdn.example.com/ok.png",
    "https://user@cdn.example.com/ok.png", "https://user:pw@cdn.example.com/ok.png",
    "https://cdn.example.com@evil.example.org/ok.png", "https://cdn.example.com:8443/ok.png",
    "https://cdn.example.com:80/ok.png", "https://cdn.example.com:0/ok.png", "https://cdn.example.com:99999/x",
    "https://127.0.0.1/ok.png", "https://2130706433/ok.png", "https://0177.0.0.1/ok.png", "https://127.1/ok.png",
    "https://0x7f.0.0.1/ok.png", "https://0x7f000001/ok.png", "https://017700000001/ok.png",
    "https://[::1]/ok.png", "https://[::ffff:127.0.0.1]/ok.png", "https://[::ffff:7f00:1]/ok.png",
    "https://169.254.169.254/latest/meta-data/", "https://[fd00:ec2::254]/", "https://100.100.100.200/",
    "https://metadata.google.internal/computeMetadata/v1/", "https://evil.example.org/ok.png",
    "https://cdn.example.com.evil.example.org/ok.png", "https://evilcdn.example.com/ok.png",
    "https://cdn.exаmple.com/ok.png", "https://cdn.example.com\\@evil.example.org/", "https:///ok.png",
    "https://cdn.example.com/ok.png\r\nHost: evil", "https://cdn example.com/", "",
]

RESOLUTION_CASES = {
    "loopback": ["127.0.0.1"], "private-10": ["10.0.0.1"], "private-172": ["172.16.5.4"],
    "private-192": ["192.168.0.10"], "metadata-v4": ["169.254.169.254"], "metadata-v6": ["fd00:ec2::254"],
    "cgnat": ["100.64.0.1"], "unspecified": ["0.0.0.0"], "v6-loopback": ["::1"],
    "mapped-loopback": ["::ffff:127.0.0.1"],
    "mapped-metadata": ["::ffff:169.254.169.254"], "nat64-private": ["64:ff9b::a00:1"], "6to4": ["2002:a00:1::1"],
    "link-local-v6": ["fe80::1%eth0"], "mixed-public-private": ["93.184.216.34", "10.0.0.1"],
    "mixed-private-first": ["192.168.1.1", "93.184.216.34"], "multicast": ["224.0.0.251"], "no-answers": [],
}

TRANSFER_CASES = [
    "/html-as-png", "/truncated.png", "/not-found", "/gzip", "/big-honest", "/big-chunked", "/big-lying",
    "/redirect?to=http://cdn.example.com/ok.png", "/redirect?to=https://evil.example.org/ok.png",
    "/redirect?to=https://internal.example.com/ok.png", "/redirect?to=https://127.0.0.1/ok.png",
    "/redirect?to=file:///etc/passwd", "/loop0",
]
