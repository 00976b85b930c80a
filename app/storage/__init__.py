"""Blob storage behind one small interface; the backend is chosen by BLOB_BACKEND."""

from __future__ import annotations

from app.registry import find_service
from app.storage.base import BlobNotFound, BlobStore, BlobStoreError
from app.storage.gcs import GcsBlobStore
from app.storage.local import LocalBlobStore

__all__ = ["BlobStore", "BlobStoreError", "BlobNotFound", "get_blob_store", "build_blob_store"]


def build_blob_store(config) -> BlobStore:
    backend = config["BLOB_BACKEND"]
    if backend == "local":
        return LocalBlobStore.from_config(config)
    if backend == "gcs":
        return GcsBlobStore.from_config(config)
    raise RuntimeError(f"unknown BLOB_BACKEND {backend!r} (use local or gcs)")


def get_blob_store() -> BlobStore:
    """The app's blob store (service `blob_store`, app.registry)."""
    return find_service("blob_store")
