"""The service registry: one instance per app, name and key; overrides; one build under concurrency."""

from __future__ import annotations

import threading
import time

import pytest
from flask import Flask

from app.registry import find_service, init_registry, override_service, registry_of


def make_app(factories):
    app = Flask(__name__)
    app.config["GREETING"] = "hello"
    init_registry(app, factories)
    return app


def test_built_once_per_app_and_key_from_the_app_config():
    built = []

    def factory(config, *key):
        built.append(key)
        return (config["GREETING"], *key)

    first, second = make_app({"thing": factory}), make_app({"thing": factory})
    with first.app_context():
        assert find_service("thing") is find_service("thing") == ("hello",)
        assert find_service("thing", "a") == ("hello", "a") and find_service("thing", "a") is find_service("thing", "a")
    with second.app_context():
        find_service("thing")
    assert built == [(), ("a",), ()]


def test_unknown_service_is_an_error():
    with make_app({}).app_context(), pytest.raises(LookupError, match="nope"):
        find_service("nope")


def test_override_replaces_the_factory_and_restores_it():
    app = make_app({"thing": lambda config: "real"})
    with app.app_context():
        assert find_service("thing") == "real"
        with override_service(app, "thing", lambda config: "fake"):
            assert find_service("thing") == "fake"
        assert find_service("thing") == "real"
        with override_service(app, "other", lambda config: "only here"):
            assert find_service("other") == "only here"
        with pytest.raises(LookupError):
            find_service("other")


def test_drop_rebuilds_from_the_current_config():
    app = make_app({"thing": lambda config: config["GREETING"]})
    with app.app_context():
        assert find_service("thing") == "hello"
        app.config["GREETING"] = "bye"
        assert find_service("thing") == "hello"
        registry_of(app).drop("thing")
        assert find_service("thing") == "bye"


def test_concurrent_first_use_builds_once_and_a_factory_may_use_another_service():
    calls = []

    def slow(config):
        calls.append("slow")
        time.sleep(0.1)
        return object()

    app = make_app({"slow": slow, "wrapper": lambda config: ("wrapped", find_service("slow"))})
    results = []

    def use():
        with app.app_context():
            results.append(find_service("wrapper")[1])

    threads = [threading.Thread(target=use) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["slow"] and len({id(r) for r in results}) == 1
