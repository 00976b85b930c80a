"""The project as operators run it: an installed package, an image context without local state."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_every_top_level_module_imports_from_another_directory(tmp_path):
    """The console scripts (`celery`, `flask`, `gunicorn`) do not keep the working directory on sys.path
    (celery adds it only while it loads `-A workers`): a lazy `import migrations` in a task failed. The
    project is installed (`make install`: `pip install --no-deps -e .`), so every module resolves anywhere."""
    # `workers` and `wsgi` build an app when imported (a database): found, not imported
    code = ("import importlib.util, app.config, celeryconfig, migrations.runner\n"
            "assert importlib.util.find_spec('workers') and importlib.util.find_spec('wsgi')\n"
            "print(migrations.runner.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"run `make install` (pip install --no-deps -e .): {out.stderr[-2000:]}"
    assert out.stdout.strip().endswith(os.path.join("migrations", "runner.py"))


def _dockerignore_patterns() -> list[str]:
    """.dockerignore read as the docker client reads it (docker.api.build: stripped, no blanks, no comments)."""
    path = os.path.join(ROOT, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f.read().splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_image_context_holds_no_local_state_or_secrets(tmp_path):
    """`docker build` sends the context minus .dockerignore; the Dockerfile does `COPY . .`. Built on a
    checkout that has every kind of local state, the context (docker's own pattern rules) holds the
    code and none of it."""
    from docker.utils.build import exclude_paths

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    checkout = tmp_path / "checkout"
    for name in tracked:
        if os.path.isfile(os.path.join(ROOT, name)):
            target = checkout / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(open(os.path.join(ROOT, name), "rb").read())
    local_state = [".git/config", ".git/objects/ab/cdef", ".venv/bin/python", ".venv/lib/site.py", "venv/pyvenv.cfg",
                   "var/jwt-secret", "var/pg/PG_VERSION", "var/outbox/mail.eml", "var/blobs/a/b.png",
                   "var/celerybeat-schedule", ".env", ".env.production", ".flaskenv", "docker/.env",
                   "celerybeat-schedule.db", "celerybeat-schedule.dat", "app/__pycache__/x.cpython-311.pyc",
                   "platform_gateway.egg-info/PKG-INFO", ".pytest_cache/v/x", ".ruff_cache/x", ".hypothesis/x",
                   "bench/results/run.json", "certs/server.key", "tls.pem", "gcp-credentials.json",
                   "docker/service-account.json"]
    for name in local_state:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("secret")
    context = exclude_paths(str(checkout), _dockerignore_patterns(), dockerfile="docker/Dockerfile")
    leaked = sorted(p for p in context if p in local_state or p.split("/")[0] in {".git", ".venv", "venv", "var"})
    assert not leaked, f"the image context would hold local state: {leaked}"
    for needed in ("requirements.txt", "pyproject.toml", "wsgi.py", "celeryconfig.py", "app/__init__.py",
                   "workers/__init__.py", "migrations/runner.py", "docker/gunicorn.conf.py", "docker/Dockerfile"):
        assert needed in context, f"{needed} is missing from the image context"
    assert any(p.startswith("migrations/product/versions/") for p in context)
