"""The client cannot drift from the API: its models are regenerated from the app's OpenAPI document and its
synchronous half from the asynchronous one (both must equal what is committed), every request it can send
names an operation of the document, every operation of the document has a client method, and the package
type-checks under `mypy --strict`."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CLIENT = os.path.join(ROOT, "clients", "python")
PACKAGE = os.path.join(CLIENT, "platform_gateway_client")
# Operations the client leaves out on purpose: none today. An entry here needs a reason.
NOT_IN_CLIENT: set[tuple[str, str]] = set()


def _codegen():
    spec = importlib.util.spec_from_file_location("pgc_codegen", os.path.join(CLIENT, "tools", "codegen.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def document(app):
    return app.test_client().get("/api/v1/openapi.json").get_json()


def _read(name: str) -> str:
    with open(os.path.join(PACKAGE, name)) as fh:
        return fh.read()


def test_models_are_generated_from_the_current_openapi_document(document):
    assert _codegen().render_models(document) == _read("models.py"), (
        "clients/python/platform_gateway_client/models.py is stale: run `.venv/bin/python "
        "clients/python/tools/codegen.py` and commit the result")


def test_the_sync_client_is_generated_from_the_async_one():
    assert _codegen().render_sync(_read("_async.py")) == _read("_sync.py"), (
        "clients/python/platform_gateway_client/_sync.py is stale: run `.venv/bin/python "
        "clients/python/tools/codegen.py` and commit the result")


def test_every_model_field_names_the_documents_fields(document):
    """The generated TypedDicts, read back at run time: the same fields, the same required ones."""
    from typing import get_type_hints

    from platform_gateway_client import models

    for name, schema in document["components"]["schemas"].items():
        model = getattr(models, name)
        assert set(get_type_hints(model)) == set(schema.get("properties") or {}), name
        assert model.__required_keys__ == frozenset(schema.get("required") or ()), name


def _client_operations() -> set[tuple[str, str]]:
    """(method, path template) of every request the client sends: each is a literal pair in _async.py."""
    pairs = re.findall(r'"(GET|POST|PUT|DELETE)",\s*"(/[^"]*)"', _read("_async.py"))
    return set(pairs)


def test_every_client_request_is_an_operation_of_the_document_and_back(document):
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops
                  if method in ("get", "post", "put", "delete")}
    used = _client_operations()
    assert used - documented == set(), "the client calls operations the API does not document"
    assert documented - used - NOT_IN_CLIENT == set(), "operations without a client method"


def test_the_package_type_checks_strictly(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in requirements-dev.txt (`make install`)")
    cache = os.path.join(ROOT, "var", "test", "mypy-cache")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11", "--cache-dir", cache,
                          "platform_gateway_client", os.path.join(ROOT, "tests", "client", "typed_usage.py")],
                         cwd=CLIENT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
