"""The text a record is embedded from, and the content hash that tells a current vector from a stale one.

Text: the record name on the first line, then one `field name: value` line per configured field, in
the configured order (an empty field list means the name alone). The field name gives the model
context for short values (`year: 2019`, `color: red`). Missing and empty values are skipped.
Whitespace inside a value collapses to single spaces so cosmetic edits do not change the text, and
the result is deterministic — the content hash depends on it.

Hash: sha256 over model, dimensions and text. A stored vector whose hash differs from the hash of
the record's current text (or whose model/dimensions changed in the definition) is stale.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

_WHITESPACE = re.compile(r"\s+")
DEFAULT_MAX_TEXT_CHARS = 8000


def build_embedding_text(name: str | None, fields: Mapping[str, Any] | None, field_names: Iterable[str] | None,
                         *, max_chars: int | None = DEFAULT_MAX_TEXT_CHARS) -> str:
    """The embedding text for a record: name, then the configured fields in order.

    `max_chars` caps the result (a remote model rejects inputs past its token limit; the local one
    only reads its first 256 tokens anyway). None or 0 = no cap.
    """
    lines = []
    title = _clean(name or "")
    if title:
        lines.append(title)
    fields = fields or {}
    seen = set()
    for field in field_names or ():
        if field in seen:
            continue
        seen.add(field)
        value = stringify(fields.get(field))
        if value:
            lines.append(f"{_label(field)}: {value}")
    text = "\n".join(lines)
    if max_chars and len(text) > max_chars:
        text = text[:max_chars].rstrip()
    return text


def stringify(value: Any) -> str:
    """A field value as embedding text: scalars plainly, lists comma-joined, objects as `key: value` pairs."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, Mapping):
        parts = (f"{_label(str(k))}: {text}" for k, v in value.items() if (text := stringify(v)))
        return "; ".join(parts)
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return ", ".join(text for item in items if (text := stringify(item)))
    return _clean(str(value))


def embedding_content_hash(model: str, dimensions: int | None, text: str) -> str:
    """sha256 hex of model, dimensions and text: equal hashes mean the stored vector is current."""
    digest = hashlib.sha256()
    for part in (model, "" if dimensions is None else str(int(dimensions)), text):
        encoded = part.encode("utf-8")
        # Length-prefixed, so ("ab", "c") and ("a", "bc") can never collide.
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
    return digest.hexdigest()


def _clean(text: str) -> str:
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def _label(field: str) -> str:
    return _clean(field.replace("_", " "))
