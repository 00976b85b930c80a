"""Alembic env for one product schema (search_path = that schema, then public); run through migrations.runner."""

from migrations.env_common import run_migrations

run_migrations()
