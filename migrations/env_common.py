"""The body both Alembic env.py files run: migrate one schema with search_path set to it.

`migrations.runner` passes the engine and the target schema in `config.attributes`; the version
table lives in that schema, so each schema has its own migration history.
"""

from alembic import context
from sqlalchemy import text


def run_migrations() -> None:
    engine = context.config.attributes["engine"]
    schema = context.config.attributes["schema"]
    with engine.connect() as connection:
        # Product migrations use unqualified names; `public` follows for the pgvector types.
        connection.execute(text(f'SET search_path TO "{schema}", public'))
        context.configure(connection=connection, version_table_schema=schema,
                          transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
