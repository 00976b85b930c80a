"""Local blob store: files under VAR_DIR/blobs/<container>/, served publicly at /blobs/<container>/."""

from __future__ import annotations

import os
import tempfile

from app.storage.base import BlobNotFound, BlobStore, BlobStoreError


class LocalBlobStore(BlobStore):
    def __init__(self, root: str, container: str, public_base_url: str) -> None:
        self.root = os.path.abspath(root)
        self.container = container
        self.public_base_url = public_base_url

    @classmethod
    def from_config(cls, config) -> LocalBlobStore:
        container = config["BLOB_CONTAINER"]
        base = config.get("BLOB_PUBLIC_BASE_URL") or (
            f"{config['PUBLIC_BASE_URL'].rstrip('/')}/blobs/{container}")
        return cls(os.path.join(config["VAR_DIR"], "blobs", container), container, base)

    def _path(self, key: str) -> str:
        path = os.path.abspath(os.path.join(self.root, key))
        if not path.startswith(self.root + os.sep):
            raise BlobNotFound(key)
        return path

    def put(self, key: str, data: bytes, content_type: str) -> str:
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".upload-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # readers never see a half-written file
        except OSError as exc:
            raise BlobStoreError(f"local blob write failed: {exc}") from exc
        return self.public_url(key)

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise BlobNotFound(key) from None
        except OSError as exc:
            raise BlobStoreError(str(exc)) from exc

    def check(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise BlobStoreError(f"{self.root} is not writable")
