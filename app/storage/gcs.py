"""Google Cloud Storage blob store: bucket = container, public URL from config.

Objects are written with a long-lived public Cache-Control (keys are uuid names, never rewritten).
Making the objects readable by browsers is the bucket's job (uniform bucket-level access with
`allUsers:objectViewer`, or a CDN in front); this class never signs URLs.
"""

from __future__ import annotations

import threading

from app.storage.base import BlobNotFound, BlobStore, BlobStoreError

CACHE_CONTROL = "public, max-age=31536000, immutable"
PUBLIC_GCS = "https://storage.googleapis.com"


class GcsBlobStore(BlobStore):
    def __init__(self, bucket: str, public_base_url: str, *, project: str | None = None,
                 endpoint: str | None = None, timeout: float = 60.0) -> None:
        self.container = bucket
        self.public_base_url = public_base_url
        self.project = project or None
        self.endpoint = endpoint or None
        self.timeout = timeout
        self._client = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config) -> GcsBlobStore:
        bucket = config["BLOB_CONTAINER"]
        endpoint = config.get("GCS_ENDPOINT") or None
        base = config.get("BLOB_PUBLIC_BASE_URL") or f"{(endpoint or PUBLIC_GCS).rstrip('/')}/{bucket}"
        return cls(bucket, base, project=config.get("GCS_PROJECT"), endpoint=endpoint)

    @property
    def client(self):
        """The storage client, created on first use (its HTTP session pools connections)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self):
        from google.cloud import storage  # google-cloud-storage loads only with BLOB_BACKEND=gcs

        if self.endpoint:
            # An emulator (tests, local development): no Google credentials involved.
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(project=self.project or "local", credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": self.endpoint})
        return storage.Client(project=self.project)

    def _retry(self, seconds: float | None = None):
        """google's default retry keeps trying for 120 s; ours stops within the store's timeout, so a
        GCS outage cannot eat the whole image budget."""
        from google.cloud.storage.retry import DEFAULT_RETRY  # google-cloud-storage: as in _make_client

        return DEFAULT_RETRY.with_timeout(seconds or self.timeout)

    def _blob(self, key: str):
        return self.client.bucket(self.container).blob(key)

    def put(self, key: str, data: bytes, content_type: str) -> str:
        try:
            blob = self._blob(key)
            blob.cache_control = CACHE_CONTROL
            # if_generation_match=0: create only; a uuid key is never overwritten
            blob.upload_from_string(data, content_type=content_type, timeout=self.timeout,
                                    if_generation_match=0, retry=self._retry())
        except Exception as exc:  # google.api_core errors, transport errors
            raise BlobStoreError(f"gcs upload of {key} failed: {type(exc).__name__}: {exc}") from exc
        return self.public_url(key)

    def get(self, key: str) -> bytes:
        from google.api_core.exceptions import NotFound as GcsNotFound  # as in _make_client

        try:
            return self._blob(key).download_as_bytes(timeout=self.timeout, retry=self._retry())
        except GcsNotFound:
            raise BlobNotFound(key) from None
        except Exception as exc:
            raise BlobStoreError(f"gcs download of {key} failed: {type(exc).__name__}: {exc}") from exc

    def check(self) -> None:
        try:
            # objects.list needs only object-level read access (no storage.buckets.get)
            next(iter(self.client.list_blobs(self.container, max_results=1, timeout=5,
                                             retry=self._retry(5))), None)
        except Exception as exc:
            raise BlobStoreError(f"gcs bucket {self.container} unusable: {type(exc).__name__}: {exc}") from exc
