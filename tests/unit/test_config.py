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


def test_the_env_file_lies_beneath_the_environment(monkeypatch, tmp_path):
    """ENV_FILE (default .env beside the Makefile) is read by every process: make run, workers, CLI."""
    env_file = tmp_path / "gateway.env"
    env_file.write_text("PORT=9100\nLOG_LEVEL=DEBUG\nVAR_DIR=state\n# a comment\nJWT_ISSUER='quoted'\n")
    monkeypatch.setenv("ENV_FILE", str(env_file))
    monkeypatch.setenv("LOG_LEVEL", "ERROR")
    monkeypatch.delenv("VAR_DIR", raising=False)
    config = load_config()
    assert config["PORT"] == 9100 and config["JWT_ISSUER"] == "quoted"
    assert config["LOG_LEVEL"] == "ERROR"  # the environment wins
    assert config["VAR_DIR"] == str(tmp_path / "state")  # relative to the file, not the working directory
    assert config["VAR_DIR_EXPLICIT"] is True
    assert load_config({"PORT": 1})["PORT"] == 1


def test_without_an_env_file_var_dir_is_nobodys_choice(monkeypatch):
    monkeypatch.setenv("ENV_FILE", "")
    monkeypatch.delenv("VAR_DIR", raising=False)
    config = load_config()
    assert config["VAR_DIR"] == os.path.abspath("./var") and config["VAR_DIR_EXPLICIT"] is False
    assert load_config({"VAR_DIR": "/x"})["VAR_DIR_EXPLICIT"] is True


def test_a_named_env_file_that_does_not_exist_is_an_error(monkeypatch, tmp_path):
    import pytest

    monkeypatch.setenv("ENV_FILE", str(tmp_path / "missing.env"))
    with pytest.raises(RuntimeError, match="missing.env does not exist"):
        load_config()
