"""One registry for the app's lazily built singletons (as warehouse's `find_service`).

`create_app` registers a factory per service name (`register_services`); code asks for an instance
with `find_service(name, *key)`. The first call for (name, key) builds it with
`factory(config, *key)`; every later call of the same app gets the same object. A keyed service is
one instance per key (image providers by name, embedders by model/dimensions).

Locking rule (the only one): a lookup is a plain dict read; a miss takes the registry's one
re-entrant lock, looks again, and builds. A factory may ask for another service (the fetcher asks
for the blob store) under the same lock. The services themselves must be safe to share between
threads.

Tests replace a factory with `override_service(app, name, factory)` (a context manager that drops
the built instances on entry and exit), never by writing into `app.extensions`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flask import Flask, current_app

Factory = Callable[..., Any]
EXTENSION = "services"


class ServiceRegistry:
    def __init__(self, config) -> None:
        self.config = config
        self.factories: dict[str, Factory] = {}
        self.instances: dict[tuple, Any] = {}
        self.lock = threading.RLock()

    def register(self, name: str, factory: Factory) -> None:
        with self.lock:
            self.factories[name] = factory
            self.drop(name)

    def find(self, name: str, *key: Any) -> Any:
        instance = self.instances.get((name, *key))
        if instance is None:
            with self.lock:
                instance = self.instances.get((name, *key))
                if instance is None:
                    factory = self.factories.get(name)
                    if factory is None:
                        raise LookupError(f"no service {name!r} is registered")
                    instance = self.instances[(name, *key)] = factory(self.config, *key)
        return instance

    def drop(self, name: str) -> None:
        """Forget the built instances of `name` (the next lookup builds them from the current config)."""
        with self.lock:
            for built in [k for k in self.instances if k[0] == name]:
                del self.instances[built]


def init_registry(app: Flask, factories: dict[str, Factory]) -> ServiceRegistry:
    registry = app.extensions[EXTENSION] = ServiceRegistry(app.config)
    for name, factory in factories.items():
        registry.register(name, factory)
    return registry


def registry_of(app: Flask) -> ServiceRegistry:
    return app.extensions[EXTENSION]


def find_service(name: str, *key: Any) -> Any:
    """The current app's instance of service `name` (for `key`), built on first use."""
    return current_app.extensions[EXTENSION].find(name, *key)


@contextlib.contextmanager
def override_service(app: Flask, name: str, factory: Factory) -> Iterator[None]:
    """Tests: build `name` with `factory(config, *key)` inside the block; the original factory after."""
    registry = registry_of(app)
    original = registry.factories.get(name)
    registry.register(name, factory)
    try:
        yield
    finally:
        if original is None:
            registry.factories.pop(name, None)
            registry.drop(name)
        else:
            registry.register(name, original)
