"""Building blocks of the entity store services: timestamps, version checks, unique-constraint
409s and the storable-payload check (no NaN; NUL is the parser's rule, app.jsonbody)."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, ValidationFailed


def flatten_messages(messages: Any, prefix: str = "") -> str:
    if isinstance(messages, dict):
        return "; ".join(flatten_messages(v, f"{prefix}{k}: " if not prefix else f"{prefix[:-2]}.{k}: ")
                         for k, v in messages.items())
    if isinstance(messages, list):
        return prefix + ", ".join(str(m) for m in messages)
    return f"{prefix}{messages}"


def check_version(sent: Any, current: int, what: str) -> None:
    if sent is not None and sent != current:
        raise Conflict(f"The {what} was changed by someone else (version {current}, you sent {sent}); "
                       "reload and retry.", {"currentVersion": current})


def flush_unique(session: Session, message: str) -> None:
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(message) from None  # the unit of work (or the upsert's savepoint) rolls back

def unstorable_errors(value: Any, path: str, out: dict[str, list[str]]) -> None:
    """JSONB cannot hold NaN/Infinity (a number too big for a float parses to infinity): name each
    place. (A NUL character is refused for the whole request by the parser, app.jsonbody.)"""
    if isinstance(value, float):
        if not math.isfinite(value):
            out.setdefault(path, []).append("must be a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            unstorable_errors(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            unstorable_errors(item, f"{path}[{i}]", out)


def check_storable(payload: Any, what: str = "Request") -> None:
    """400 naming every non-finite number in a payload (never a database error)."""
    errors: dict[str, list[str]] = {}
    unstorable_errors(payload, "", errors)
    if errors:
        raise ValidationFailed(f"{what} contains values that cannot be stored.", {"fields": errors})
