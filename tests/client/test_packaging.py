"""platform-gateway-client is an installable package: a wheel builds from clients/python with what the
venv already has (setuptools, no index), and holds the package, its generated modules and `py.typed`."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def test_the_client_builds_as_a_typed_wheel(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp_path), os.path.join(ROOT, "clients", "python")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    assert wheel.startswith("platform_gateway_client-")
    names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
    for module in ("__init__.py", "_async.py", "_sync.py", "_core.py", "errors.py", "models.py", "py.typed"):
        assert f"platform_gateway_client/{module}" in names
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(tmp_path / wheel).read(metadata).decode()
    assert "Requires-Dist: httpx" in text and "Requires-Python: >=3.11" in text
