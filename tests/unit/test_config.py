"""Configuration: precedence, and the README table staying complete."""

import os

from app.config import SETTINGS, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_setting_is_in_the_readme():
    readme = open(os.path.join(ROOT, "README.md")).read()
    missing = [name for name in SETTINGS if f"`{name}`" not in readme]
    assert missing == []


def test_precedence_defaults_env_overrides(monkeypatch):
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("SMTP_STARTTLS", "false")
    config = load_config({"DEFAULT_PRODUCT": "x"})
    assert config["PORT"] == 9001 and config["SMTP_STARTTLS"] is False
    assert config["DEFAULT_PRODUCT"] == "x"
    assert config["JWT_ISSUER"] == "platform-gateway"
