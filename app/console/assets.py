"""Static files of the console and the API docs page: content-hashed names, gzip, and cache headers.

- The console's own files (`static/`: console.js, console.css, vendor/chart.umd.min.js) are linked by
  a name that carries a hash of their content (`console.3f9a0c1b2d4e.js`): a browser keeps them a year
  without asking again (`immutable`), and a new build is a new name, so no one ever runs a stale file.
- Every file is sent gzip-compressed when the request's Accept-Encoding allows it (compressed once per
  process, on first request, then kept in memory), with `Vary: Accept-Encoding` and a strong ETag of
  the content, so an unhashed file (the docs page's) is revalidated with a 304 and no body.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
import os
import re
import threading
from dataclasses import dataclass, field

from flask import Request, Response

ONE_YEAR = 365 * 24 * 3600
IMMUTABLE = f"public, max-age={ONE_YEAR}, immutable"
REVALIDATE = "no-cache"
_MIN_GZIP = 512  # smaller answers gain nothing from compression
_Q = re.compile(r"^\s*([^;\s]+)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*$")


def accepts_gzip(request: Request) -> bool:
    """Whether Accept-Encoding allows gzip (`gzip` or `*` with a q above 0; `gzip;q=0` refuses)."""
    allowed: dict[str, float] = {}
    for part in (request.headers.get("Accept-Encoding") or "").split(","):
        match = _Q.match(part)
        if match:
            try:
                allowed[match.group(1).lower()] = float(match.group(2)) if match.group(2) else 1.0
            except ValueError:
                continue
    quality = allowed.get("gzip", allowed.get("x-gzip", allowed.get("*", 0.0)))
    return quality > 0


@dataclass
class Asset:
    path: str
    content: bytes
    digest: str
    mimetype: str
    _gzipped: bytes | None = field(default=None, repr=False)

    def gzipped(self) -> bytes:
        if self._gzipped is None:
            self._gzipped = gzip.compress(self.content, compresslevel=9, mtime=0)
        return self._gzipped


def _load(path: str) -> Asset:
    with open(path, "rb") as fh:
        content = fh.read()
    mimetype = mimetypes.guess_type(path)[0] or "application/octet-stream"
    if mimetype.startswith("text/") or mimetype in ("application/javascript", "text/javascript"):
        mimetype += "; charset=utf-8"
    return Asset(path, content, hashlib.sha256(content).hexdigest()[:12], mimetype)


def hashed_name(name: str, digest: str) -> str:
    """`vendor/chart.umd.min.js` → `vendor/chart.umd.min.<digest>.js`."""
    stem, ext = os.path.splitext(name)
    return f"{stem}.{digest}{ext}"


class AssetStore:
    """The files of one folder, read once per process (a deploy restarts the process)."""

    def __init__(self, folder: str, *, hashed: bool) -> None:
        self.folder = os.path.realpath(folder)
        self.hashed = hashed
        self._by_name: dict[str, Asset] = {}
        self._by_url: dict[str, Asset] = {}
        self._lock = threading.Lock()

    def _asset(self, name: str) -> Asset | None:
        path = os.path.realpath(os.path.join(self.folder, name))
        if not path.startswith(self.folder + os.sep) or not os.path.isfile(path):
            return None
        with self._lock:
            if name not in self._by_name:
                asset = _load(path)
                self._by_name[name] = asset
                self._by_url[hashed_name(name, asset.digest) if self.hashed else name] = asset
            return self._by_name[name]

    def url_name(self, name: str) -> str:
        """The name a page links (`console.<digest>.js`); KeyError for a file that does not exist."""
        asset = self._asset(name)
        if asset is None:
            raise KeyError(name)
        return hashed_name(name, asset.digest) if self.hashed else name

    def find(self, url_name: str) -> Asset | None:
        found = self._by_url.get(url_name)
        if found is not None or self.hashed:  # a hashed name is known once its page was rendered …
            return found or self._find_hashed(url_name)
        return self._asset(url_name)

    def _find_hashed(self, url_name: str) -> Asset | None:
        # … or after a restart: strip the digest, load the file, and answer only if it still matches
        match = re.fullmatch(r"(.+)\.([0-9a-f]{12})(\.[A-Za-z0-9]+)", url_name)
        if not match:
            return None
        asset = self._asset(match.group(1) + match.group(3))
        return asset if asset is not None and asset.digest == match.group(2) else None


def send(asset: Asset, request: Request, *, immutable: bool) -> Response:
    """The asset with its cache headers (`immutable` for a hashed name); gzip when accepted; 304 for
    a matching If-None-Match."""
    headers = {"Cache-Control": IMMUTABLE if immutable else REVALIDATE, "Vary": "Accept-Encoding",
               "ETag": f'"{asset.digest}"', "X-Content-Type-Options": "nosniff"}
    if request.if_none_match.contains(asset.digest):
        return Response(status=304, headers=headers)
    body = asset.content
    if len(body) >= _MIN_GZIP and accepts_gzip(request):
        body = asset.gzipped()
        headers["Content-Encoding"] = "gzip"
    return Response(body, status=200, headers=headers, content_type=asset.mimetype)


def compress_page(response: Response, request: Request) -> Response:
    """gzip a rendered page (small, so on the fly) when the client accepts it."""
    if response.direct_passthrough or response.status_code != 200 or "Content-Encoding" in response.headers:
        return response
    body = response.get_data()
    response.headers["Vary"] = "Accept-Encoding"
    if len(body) >= _MIN_GZIP and accepts_gzip(request):
        response.set_data(gzip.compress(body, compresslevel=6, mtime=0))
        response.headers["Content-Encoding"] = "gzip"
    return response
