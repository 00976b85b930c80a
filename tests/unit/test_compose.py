"""docker/compose.yaml as an operator runs it: valid Compose, every service health-checked, no secret
written into the file, the release named by the operator, blobs shared by api and worker.

The schema is the Compose Specification's JSON schema as the `check-jsonschema` package ships it
(`check_jsonschema/builtin_schemas/vendor/compose-spec.json`, pinned in requirements-dev.txt),
validated with jsonschema. Compose validates after interpolation, so the file is interpolated first
(`${VAR}`, `${VAR:-default}`, `${VAR:?message}`, `$$`), as `docker compose config` does.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re

import jsonschema
import pytest
import yaml

from tests.conftest import ROOT

COMPOSE = os.path.join(ROOT, "docker", "compose.yaml")
REQUIRED = {"GATEWAY_TAG": "2026.11.2", "POSTGRES_PASSWORD": "pg-pass", "JWT_SECRET": "j" * 40,
            "FLOWER_BASIC_AUTH": "ops:flower-pass"}
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
_SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH|API_KEY|CREDENTIALS|PRIVATE")


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of the forms this file uses."""

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = env.get(name)
        if op in (":-", "-"):
            return value if value or (op == "-" and value is not None) else arg
        if op in (":?", "?"):
            if not value and not (op == "?" and value is not None):
                raise MissingVariable(f"{name}: {arg}")
            return value
        return value or ""

    return _VAR.sub(one, text)


def raw() -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(f)


def resolved(env: dict[str, str] | None = None) -> dict:
    with open(COMPOSE) as f:
        return yaml.safe_load(interpolate(f.read(), REQUIRED if env is None else env))


def compose_schema() -> dict:
    path = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(path.read_text())


def test_compose_file_is_valid_against_the_compose_specification():
    schema = compose_schema()
    assert schema["title"] == "Compose Specification"
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(resolved())]
    assert not errors, errors


def test_the_schema_check_catches_a_broken_file():
    """The validator is not vacuous: a misspelt key and a wrong type are reported."""
    schema = compose_schema()
    broken = resolved()
    broken["services"]["api"]["helthcheck"] = {"test": ["CMD", "true"]}
    broken["services"]["worker"]["ports"] = 8000
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert len(list(validator.iter_errors(broken))) >= 2


def test_every_service_has_a_health_check():
    services = resolved()["services"]
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and not check.get("disable") and check.get("test") not in (None, ["NONE"]), \
            f"service {name} has no health check"


def test_depends_on_waits_for_healthy_services():
    for name, service in resolved()["services"].items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert rule == {"condition": "service_healthy"}, f"{name} starts before {dependency} is healthy"


def _variable_only(value: str) -> bool:
    """`${NAME}`, `${NAME:?message}` or `${NAME:-}` (no literal default): the operator supplies it."""
    m = _VAR.fullmatch(value)
    return bool(m and m.group(1) and (m.group(2) in (None, ":?", "?") or not m.group(3)))


def test_no_environment_value_is_a_secret_literal():
    for name, service in raw()["services"].items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        for key, value in env.items():
            value = str(value)
            if _SECRETISH.search(key):
                assert _variable_only(value), f"{name}.{key} is a literal ({value!r}): use ${{{key}:?…}}"
            for url in re.findall(r"[a-z+]+://[^\s]+", value):
                userinfo = url.split("://", 1)[1].split("@", 1)
                if len(userinfo) == 2 and ":" in userinfo[0]:
                    password = userinfo[0].split(":", 1)[1]
                    assert _variable_only(password), f"{name}.{key} carries a literal password"


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_compose_refuses_to_start_without_each_required_variable(missing):
    env = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(MissingVariable, match=missing):
        resolved(env)


def test_the_image_tag_is_named_by_the_operator():
    app_services = {n: s for n, s in raw()["services"].items() if "build" in s}
    assert {"api", "worker", "flower"} <= set(app_services)
    for name, service in app_services.items():
        image = service["image"]
        assert "latest" not in image and "${GATEWAY_TAG:?" in image, f"{name}: {image}"
    assert {s["image"] for s in resolved()["services"].values() if "build" in s} == {"platform-gateway:2026.11.2"}


def test_api_and_worker_share_one_blob_volume_at_the_blob_directory():
    with open(os.path.join(ROOT, "docker", "Dockerfile")) as f:
        var_dir = re.search(r"VAR_DIR=(\S+)", f.read()).group(1)
    compose = resolved()
    mounts = {}
    for name in ("api", "worker"):
        mounts[name] = [v for v in compose["services"][name].get("volumes", [])
                        if str(v).endswith(":" + var_dir + "/blobs")]
        assert len(mounts[name]) == 1, f"{name} has no volume at {var_dir}/blobs"
    volume = mounts["api"][0].split(":")[0]
    assert mounts["worker"][0].split(":")[0] == volume and volume in compose["volumes"]


def gunicorn_settings(env: dict[str, str]) -> dict:
    """docker/gunicorn.conf.py's settings under the environment `env`."""
    import runpy
    from unittest import mock

    with mock.patch.dict(os.environ, env):
        return runpy.run_path(os.path.join(ROOT, "docker", "gunicorn.conf.py"))


@pytest.mark.parametrize("budget", ["120", "300"])
def test_graceful_shutdown_outlasts_an_image_call(budget):
    """SIGTERM: an accepted image call (IMAGE_TIMEOUT_SECONDS) finishes before gunicorn stops waiting."""
    settings = gunicorn_settings({"IMAGE_TIMEOUT_SECONDS": budget})
    assert settings["graceful_timeout"] > float(budget)
    assert settings["timeout"] > float(budget)


def test_each_api_container_waits_longer_than_gunicorns_graceful_timeout():
    """Both pools: the image pool drains an image call (the image budget + 10 s), the other pool within
    30 s (GUNICORN_GRACEFUL_TIMEOUT), and each container's stop grace lies above its gunicorn's."""
    services = resolved()["services"]
    for name in ("api", "api-images"):
        env = {key: str(value) for key, value in services[name]["environment"].items()}
        grace = int(services[name]["stop_grace_period"].rstrip("s"))
        assert grace > gunicorn_settings(env)["graceful_timeout"], name
    assert int(services["api"]["stop_grace_period"].rstrip("s")) <= 30


def test_no_beat_process_is_deployed():
    """Periodic work is the workers' maintenance loop (app.tasks.run_maintenance); a beat process would
    run idle, or be a second scheduler of the same functions (docs/decisions.md)."""
    for name, service in resolved()["services"].items():
        assert "beat" not in str(service.get("command", "")), f"service {name} runs celery beat"
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert "celery -A workers beat" not in f.read().replace("$(BIN)/", "")
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert "celerybeat-schedule*" in f.read().split()
