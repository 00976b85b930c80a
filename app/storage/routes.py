"""Public blob serving for the local backend: GET /blobs/<container>/<key> (no token, cacheable)."""

from __future__ import annotations

import mimetypes

from flask import Blueprint, Response, current_app

from app.errors import NotFound
from app.storage import get_blob_store
from app.storage.base import BlobNotFound

blobs_bp = Blueprint("blobs", __name__)
plain_blueprints = [blobs_bp]
blueprints: list = []


@blobs_bp.get("/blobs/<container>/<path:key>")
def serve_blob(container: str, key: str):
    """Serve a stored image; keys are immutable (uuid names), so they cache for a year."""
    store = get_blob_store()
    if current_app.config["BLOB_BACKEND"] != "local" or container != store.container:
        raise NotFound("Blob not found.")
    try:
        data = store.get(key)
    except BlobNotFound:
        raise NotFound("Blob not found.") from None
    mime = mimetypes.guess_type(key)[0] or "application/octet-stream"
    response = Response(data, mimetype=mime)
    response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
