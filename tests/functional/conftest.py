"""Fixtures shared by the operations tests (seeding, rollouts)."""

from __future__ import annotations

import pytest

INTERNAL = "internal-token-" + "y" * 32


@pytest.fixture(scope="module")
def seed_app(database_url):
    """An app with INTERNAL_API_TOKEN configured (the header path of /internal/seed is open)."""
    from app import create_app
    from tests.conftest import app_config

    return create_app(app_config(database_url, INTERNAL_API_TOKEN=INTERNAL))


@pytest.fixture()
def seed_client(seed_app):
    return seed_app.test_client()
