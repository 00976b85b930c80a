"""DATABASE_REPLICA_URL: a URL without a database name reads the primary's database on the replica server."""

from app.db import replica_database_url

PRIMARY = "postgresql+psycopg://gw:secret@primary.internal:5432/platform_gateway_test_gw0"


def test_no_database_name_takes_the_primarys():
    assert replica_database_url("postgresql+psycopg://gw:pw@replica.internal:5433/", PRIMARY) == \
        "postgresql+psycopg://gw:pw@replica.internal:5433/platform_gateway_test_gw0"
    assert replica_database_url("postgresql+psycopg://postgres@/?host=/run/replica", PRIMARY) == \
        "postgresql+psycopg://postgres@/platform_gateway_test_gw0?host=%2Frun%2Freplica"


def test_a_database_name_given_is_kept():
    assert replica_database_url("postgresql+psycopg://gw@replica.internal/reports", PRIMARY) == \
        "postgresql+psycopg://gw@replica.internal/reports"
