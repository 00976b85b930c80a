"""DefinitionCache (app.entities.services.definitions) under concurrent use: its bounds and its size
account hold whatever the interleaving of gets, puts and drops of request threads."""

from __future__ import annotations

import random
import threading

from app.entities.services import definitions
from app.entities.services.definitions import CachedDefinition, DefinitionCache


def test_bounds_and_size_hold_under_concurrent_gets_puts_and_drops(monkeypatch):
    monkeypatch.setattr(definitions, "DEFINITION_CACHE_MAX", 16)
    monkeypatch.setattr(definitions, "DEFINITION_CACHE_MAX_CHARS", 5_000)
    cache = DefinitionCache()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3_000):
                key = ("product_default", f"org{rng.randrange(3)}", f"d{rng.randrange(40)}")
                entry = cache.get(key)
                if entry is not None and rng.random() < 0.3:
                    cache.drop(key, entry)
                else:
                    cache.put(key, CachedDefinition(None, "t", True, rng.choice([0, 10, 300, 900, 6_000])))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache.entries) <= 16
    assert cache.size == sum(e.size for e in cache.entries.values()) <= 5_000
    assert all(e.size <= 5_000 for e in cache.entries.values())
