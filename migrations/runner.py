"""Run the migrations: the `platform` tree once, the `product` tree in every product schema.

Two Alembic script trees share this runner:
- migrations/platform: tables of the `platform` schema (version table platform.alembic_version);
- migrations/product: tables of one product, applied to each `product_<slug>` schema with the
  search_path set to that schema (version table <schema>.alembic_version). Product migrations use
  unqualified table names, so the same file serves every product.
"""

from __future__ import annotations

import logging
import os

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.db import PLATFORM_SCHEMA, product_slug, schema_for

log = logging.getLogger(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))
ADVISORY_LOCK = 0x5047_4D49  # one migrator at a time across processes


def _config(tree: str, engine: Engine, schema: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(HERE, tree))
    cfg.attributes["engine"] = engine
    cfg.attributes["schema"] = schema
    return cfg


def upgrade_platform(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{PLATFORM_SCHEMA}"'))
    command.upgrade(_config("platform", engine, PLATFORM_SCHEMA), "heads")


def upgrade_product(engine: Engine, product: str) -> None:
    schema = schema_for(product)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    command.upgrade(_config("product", engine, schema), "heads")


def create_product(engine: Engine, name: str) -> str:
    """Register a product and migrate its schema; idempotent. Returns the slug."""
    slug = product_slug(name)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO platform.products (slug, name, schema_name, created_at) "
            "VALUES (:slug, :name, :schema, now()) ON CONFLICT (slug) DO NOTHING"),
            {"slug": slug, "name": name, "schema": schema_for(slug)})
    upgrade_product(engine, slug)
    return slug


def upgrade_all(engine: Engine, default_product: str = "default") -> list[str]:
    """Migrate platform, make sure the default product exists, migrate every product schema."""
    with engine.connect() as lock_conn:
        lock_conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK})
        try:
            upgrade_platform(engine)
            create_product(engine, default_product)
            with engine.connect() as conn:
                slugs = list(conn.scalars(text("SELECT slug FROM platform.products ORDER BY slug")))
            for slug in slugs:
                upgrade_product(engine, slug)
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK})
            lock_conn.commit()
    return slugs
