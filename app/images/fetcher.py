"""SSRF-safe fetch of reference/mask URLs (docs/decisions.md, "Image generation", SSRF fetcher).

The URL is checked as text (https, port 443, no userinfo, a DNS name on the allowlist, never an IP
literal in any encoding), the name is resolved ONCE, every resolved address must be public, and the
connection goes to the checked address with SNI and certificate verification on the original name:
no second lookup, so DNS rebinding has nothing to rebind. Redirects are re-checked by the same rules
(at most 3 hops). The body is streamed under a total deadline and a byte cap, whatever the headers
claim, and must start with PNG or JPEG magic bytes.

Every refusal raises `ReferenceRefused` with one uniform public message; the specific reason is
only logged, so error texts cannot be used to scan ports or map the network.

The resolver, the connector, the address policy and the TLS context are injectable: tests map names
to a loopback test server under an explicit test-only policy. Production uses the defaults below.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urljoin, urlsplit

from app.images.imaging import NotAnImage, inspect_image, sniff_mime

log = logging.getLogger(__name__)

REFUSED_MESSAGE = ("Reference URL refused: it must be an https URL on an allowed host that serves "
                   "a PNG or JPEG image within the size and time limits.")
MAX_BYTES = 20 * 1024 * 1024
DEADLINE_SECONDS = 10.0
MAX_REDIRECTS = 3
_REDIRECTS = {301, 302, 303, 307, 308}
_CHUNK = 64 * 1024

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Iterable[str]]
Connector = Callable[[str, int, float], socket.socket]
AddressPolicy = Callable[[IPAddress], bool]

# Ranges `ipaddress` may call global that must never be contacted (NAT64, 6to4, Teredo, IPv4-compatible,
# deprecated site-local, SRv6 SIDs, IETF protocol assignments, benchmarking) plus carrier-grade NAT
# (neither private nor global in Python) and the unspecified/"this network" block.
_BLOCKED_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "::/96", "fec0::/10", "5f00::/16",
    "192.0.0.0/24", "198.18.0.0/15", "100.64.0.0/10", "0.0.0.0/8",
))


class ReferenceRefused(Exception):
    """A reference URL was refused; `reason` is for logs only, `public_message` for the caller."""

    public_message = REFUSED_MESSAGE

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def public_address_allowed(address: IPAddress) -> bool:
    """The production policy: only globally routable unicast addresses (mapped IPv6 unwrapped)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not address.is_global or address.is_multicast:
        return False
    return not any(address in net for net in _BLOCKED_NETWORKS if net.version == address.version)


class _Watchdog:
    """Shuts the connection down at the deadline, whatever phase it is in.

    Socket timeouts are per recv: a server dripping its TLS handshake or headers byte by byte would
    never trip them. A shutdown wakes any blocked read. It works on a dup of the descriptor (the TLS
    wrapper takes the socket over), and only while armed, so a reused descriptor is never touched.
    """

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def arm(self, sock: socket.socket) -> None:
        with self._lock:
            self._fd = sock.fileno()

    def disarm(self) -> None:
        with self._lock:
            self._fd = None
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                dup = socket.fromfd(self._fd, socket.AF_INET, socket.SOCK_STREAM)
            except OSError:
                return
            try:
                dup.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                dup.close()


def system_resolver(host: str, port: int) -> list[str]:
    """All addresses the system resolver returns for `host` (one lookup)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def tcp_connector(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to exactly `address` (no name lookup, no proxy)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def normalise_host(host: str) -> str:
    """Lower-case, IDNA-encode and strip one trailing dot (for URLs and allowlist entries alike)."""
    host = host.strip().lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        return ""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return ""


def _looks_like_ip(host: str) -> bool:
    """IP literals in every spelling the C library accepts (127.1, 2130706433, 0x7f.1, 0177.0.0.1, ::1)."""
    if ":" in host:
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        pass
    last = host.rsplit(".", 1)[-1]
    return last.isdigit() or last.startswith("0x")  # a numeric TLD is never a DNS name


def _split_url(url: str) -> tuple[SplitResult, int | None]:
    """The URL's parts and port, refused when it is not a short string of printable characters or does not parse."""
    if not isinstance(url, str) or len(url) > 4096:
        raise ReferenceRefused("not a string or too long")
    if any(ord(c) < 0x21 or c in "\\\x7f" for c in url):
        raise ReferenceRefused("control, space or backslash in URL")
    try:
        parts = urlsplit(url)
        return parts, parts.port
    except ValueError as exc:
        raise ReferenceRefused(f"unparseable URL: {exc}") from None


def _check_authority(parts: SplitResult, port: int | None) -> None:
    """https, no userinfo, the default port."""
    if parts.scheme.lower() != "https":
        raise ReferenceRefused(f"scheme {parts.scheme!r}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise ReferenceRefused("userinfo in URL")
    if port not in (None, 443):
        raise ReferenceRefused(f"port {port}")


def _checked_host(parts: SplitResult) -> str:
    """The URL's host, normalised; an IP literal (bracketed or not) or an empty host is refused."""
    raw_host = parts.hostname or ""
    if "[" in parts.netloc or _looks_like_ip(raw_host.rstrip(".")):
        raise ReferenceRefused("IP-literal host")
    host = normalise_host(raw_host)
    if not host or _looks_like_ip(host):
        raise ReferenceRefused("empty or invalid host")
    return host


@dataclass(frozen=True)
class _Target:
    host: str
    path: str  # path + query, never empty


class ReferenceFetcher:
    """Fetches one reference image URL under the rules above."""

    def __init__(self, allowed_hosts: Iterable[str], *, resolver: Resolver = system_resolver,
                 connector: Connector = tcp_connector, address_allowed: AddressPolicy = public_address_allowed,
                 ssl_context: ssl.SSLContext | None = None, max_bytes: int = MAX_BYTES,
                 deadline_seconds: float = DEADLINE_SECONDS, max_redirects: int = MAX_REDIRECTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed_hosts = frozenset(h for h in (normalise_host(x) for x in allowed_hosts) if h)
        self.resolver = resolver
        self.connector = connector
        self.address_allowed = address_allowed
        self.ssl_context = ssl_context or ssl.create_default_context()
        self.max_bytes = max_bytes
        self.deadline_seconds = deadline_seconds
        self.max_redirects = max_redirects
        self.clock = clock

    # -- static checks (https and an allowed host, on the URL's text, before any I/O) ----------

    def check_url(self, url: str) -> _Target:
        """Refuse a URL on its text alone; returns the host and request path when acceptable."""
        parts, port = _split_url(url)
        _check_authority(parts, port)
        host = _checked_host(parts)
        if host not in self.allowed_hosts:
            raise ReferenceRefused(f"host {host!r} not on the allowlist")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return _Target(host, path)

    # -- the fetch ------------------------------------------------------------------------------

    def fetch(self, url: str, *, budget_seconds: float | None = None) -> bytes:
        """The body of `url` (PNG or JPEG magic bytes guaranteed), or ReferenceRefused."""
        seconds = self.deadline_seconds if budget_seconds is None else min(self.deadline_seconds, budget_seconds)
        deadline = self.clock() + seconds
        current = url
        for _hop in range(self.max_redirects + 1):
            target = self.check_url(current)
            status, location, body = self._get(target, deadline)
            if status in _REDIRECTS:
                if not location:
                    raise ReferenceRefused("redirect without Location")
                current = urljoin(f"https://{target.host}{target.path}", location)
                continue
            if status != 200:
                raise ReferenceRefused(f"HTTP {status}")
            if sniff_mime(body) is None:
                raise ReferenceRefused("body is not PNG or JPEG")
            try:
                inspect_image(body)  # a full decode under the pixel cap, not just the magic bytes
            except NotAnImage as exc:
                raise ReferenceRefused(f"body does not decode: {exc}") from None
            return body
        raise ReferenceRefused("too many redirects")

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise ReferenceRefused("deadline exceeded")
        return remaining

    def _addresses(self, host: str) -> list[str]:
        try:
            answers = list(self.resolver(host, 443))
        except OSError as exc:
            raise ReferenceRefused(f"resolution failed: {exc}") from None
        if not answers:
            raise ReferenceRefused("no addresses")
        for answer in answers:
            try:
                address = ipaddress.ip_address(str(answer).split("%", 1)[0])
            except ValueError:
                raise ReferenceRefused(f"resolver returned {answer!r}") from None
            if not self.address_allowed(address):
                # ANY forbidden answer refuses the whole name: a mixed answer is a rebinding setup.
                raise ReferenceRefused(f"{host} resolves to forbidden address {address}")
        return answers

    def _connect(self, target: _Target, deadline: float, watchdog: _Watchdog) -> ssl.SSLSocket:
        last_error: Exception | None = None
        for address in self._addresses(target.host):
            try:
                raw = self.connector(address, 443, self._remaining(deadline))
            except OSError as exc:
                last_error = exc
                continue
            watchdog.arm(raw)  # the descriptor stays the same once TLS wraps the socket
            try:
                raw.settimeout(self._remaining(deadline))
                return self.ssl_context.wrap_socket(raw, server_hostname=target.host)
            except (OSError, ValueError, ssl.SSLError) as exc:
                watchdog.disarm()
                raw.close()
                last_error = exc
            if self.clock() >= deadline:
                raise ReferenceRefused("deadline exceeded during the TLS handshake")
        raise ReferenceRefused(f"connection failed: {last_error}")

    def _get(self, target: _Target, deadline: float) -> tuple[int, str | None, bytes]:
        watchdog = _Watchdog(deadline - self.clock())
        try:
            sock = self._connect(target, deadline, watchdog)
        except BaseException:
            watchdog.disarm()
            raise
        conn = http.client.HTTPConnection(target.host, 443)
        conn.sock = sock  # already connected to the checked address; http.client never looks up the name
        try:
            conn.putrequest("GET", target.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", target.host)
            conn.putheader("Accept", "image/png, image/jpeg")
            conn.putheader("Accept-Encoding", "identity")
            conn.putheader("User-Agent", "platform-gateway-reference-fetcher")
            conn.putheader("Connection", "close")
            conn.endheaders()
            response = conn.getresponse()
            if response.status in _REDIRECTS:
                return response.status, response.getheader("Location"), b""
            if response.status != 200:
                return response.status, None, b""
            return 200, None, self._read_body(response, sock, deadline)
        except ReferenceRefused:
            raise
        except (OSError, ValueError, http.client.HTTPException, ssl.SSLError) as exc:
            if self.clock() >= deadline:
                raise ReferenceRefused("deadline exceeded") from None
            raise ReferenceRefused(f"transfer failed: {type(exc).__name__}: {exc}") from None
        finally:
            watchdog.disarm()  # before close: the descriptor number may be reused right after
            conn.close()

    def _read_body(self, response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> bytes:
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise ReferenceRefused(f"content encoding {encoding}")
        declared = response.getheader("Content-Length")
        if declared and declared.strip().isdigit() and int(declared) > self.max_bytes:
            raise ReferenceRefused("declared length over the cap")
        chunks: list[bytes] = []
        total = 0
        while True:
            sock.settimeout(self._remaining(deadline))  # the deadline is total, not per read
            try:
                chunk = response.read1(_CHUNK)
            except TimeoutError:
                raise ReferenceRefused("deadline exceeded while reading") from None
            if not chunk:
                break
            total += len(chunk)
            if total > self.max_bytes:
                raise ReferenceRefused("body over the cap")
            chunks.append(chunk)
            self._remaining(deadline)
        self._remaining(deadline)  # an EOF can be the watchdog's shutdown, not the end of the body
        return b"".join(chunks)
