"""The shipped Prometheus files (docker/prometheus/): `promtool check rules` on the alert rules, their unit
tests (`promtool test rules`), and the Grafana dashboard beside them queries only families the
application exports. promtool comes with Debian's `prometheus` (.ci/run installs it); without it these
skip, unless REQUIRE_SERVICES=1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REQUIRE_SERVICES, ROOT

PROMETHEUS_DIR = os.path.join(ROOT, "docker", "prometheus")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if REQUIRE_SERVICES:
            pytest.fail("promtool not installed (apt-get install prometheus)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_promtool_checks_the_alert_rules():
    result = subprocess.run([_promtool(), "check", "rules", "alerts.yml"], cwd=PROMETHEUS_DIR, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_alert_rules_fire_on_their_unit_tests():
    result = subprocess.run([_promtool(), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS_DIR,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _exported_families() -> set[str]:
    source = open(os.path.join(ROOT, "app", "observability", "metrics.py")).read()
    return set(re.findall(r'"(gateway_[a-z_]+)"', source))


def test_alerts_and_dashboard_use_only_exported_families():
    exported = _exported_families()
    suffixed = exported | {f"{name}{suffix}" for name in exported for suffix in ("_bucket", "_count", "_sum")}
    alerts = open(os.path.join(PROMETHEUS_DIR, "alerts.yml")).read()
    with open(os.path.join(ROOT, "docker", "grafana", "platform-gateway.json")) as fh:
        dashboard = json.load(fh)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs
    used = set(re.findall(r"\b(gateway_[a-z_]+)", alerts + "\n".join(exprs)))
    assert used and used <= suffixed, used - suffixed
