"""Blob key layout: `images/{orgId}/{yyyy-mm-dd}/{uuid}.{png|jpg}` inside the container."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime

_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg"}


def org_segment(org_id: str) -> str:
    """The org id as one path segment: itself when URL- and path-safe, else a stable digest."""
    if _SAFE_SEGMENT.match(org_id) and org_id not in {".", ".."}:
        return org_id
    return "x-" + hashlib.sha256(org_id.encode()).hexdigest()[:24]


def image_key(org_id: str, mime_type: str, now: datetime | None = None) -> str:
    """A fresh, never-reused key for one generated image of `org_id`."""
    day = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%d")
    return f"images/{org_segment(org_id)}/{day}/{uuid.uuid4()}.{EXTENSIONS[mime_type]}"
