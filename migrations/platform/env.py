"""Alembic env for the `platform` schema (run through migrations.runner)."""

from migrations.env_common import run_migrations

run_migrations()
