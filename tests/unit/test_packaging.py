"""The project as operators run it: an installed package, an image context without local state."""

from __future__ import annotations

import os
import subprocess
import sys


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
