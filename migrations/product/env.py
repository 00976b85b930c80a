"""Alembic env for one product schema (search_path = that schema, then public) (run through migrations.runner)."""

from alembic import context
from sqlalchemy import text

engine = context.config.attributes["engine"]
schema = context.config.attributes["schema"]

with engine.connect() as connection:
    connection.execute(text(f'SET search_path TO "{schema}", public'))
    context.configure(connection=connection, version_table_schema=schema,
                      transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
