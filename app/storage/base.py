"""The blob store interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from urllib.parse import urlsplit


class BlobStoreError(Exception):
    """The backend failed (mapped to 500 SYSTEM_ERROR by callers)."""


class BlobNotFound(BlobStoreError):
    pass


class BlobStore(ABC):
    """Objects addressed by key inside one container; each has a public URL."""

    container: str
    public_base_url: str  # URL under which `<key>` of this container is public

    @abstractmethod
    def put(self, key: str, data: bytes, content_type: str) -> str:
        """Store `data` under `key`; returns its public URL."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes stored under `key` (BlobNotFound if none)."""

    @abstractmethod
    def check(self) -> None:
        """Raise if the backend is unusable (health check)."""

    def public_url(self, key: str) -> str:
        return f"{self.public_base_url.rstrip('/')}/{key}"

    @property
    def public_host(self) -> str:
        return (urlsplit(self.public_base_url).hostname or "").lower()

    def key_for_url(self, url: str) -> str | None:
        """The key of one of our own public URLs, or None when `url` is not ours."""
        base = self.public_base_url.rstrip("/") + "/"
        if not url.startswith(base):
            return None
        key = url[len(base):].split("?", 1)[0].split("#", 1)[0]
        if not key or ".." in key.split("/") or key.startswith("/"):
            return None
        return key
