"""The tenant of a request (app.tenancy): where it comes from, and the helpers every tenant read uses."""

from __future__ import annotations

import pytest
from flask import g
from sqlalchemy.dialects import postgresql

from app.db import db
from app.entities.models import EntityDefinition
from app.errors import Forbidden, Unauthorized
from app.tenancy import Tenant, current_org, current_tenant, products, set_tenant, tenant_select

TENANT = Tenant(org_id="org-a", user_id="u", email="u@x.io", role=None, scopes=("read",), product="other")


def test_no_tenant_is_401_and_outside_a_context_too(app):
    with pytest.raises(Unauthorized):
        current_tenant()
    with app.app_context(), pytest.raises(Unauthorized):
        current_tenant()


def test_the_verified_tenant_overwrites_the_identity_headers(app):
    headers = {"X-Org-ID": "evil", "X-User-ID": "mallory", "X-Product": "default"}
    with app.test_request_context("/", headers=headers):
        from flask import request

        set_tenant(TENANT)
        assert current_tenant() is TENANT and current_org() == "org-a" and db.context_product() == "other"
        assert (request.headers["X-Org-ID"], request.headers["X-User-ID"], request.headers["X-Product"]) == \
            ("org-a", "u", "other")


def test_without_a_tenant_the_product_is_the_default_one(app):
    with app.app_context():
        assert db.context_product() == app.config["DEFAULT_PRODUCT"]
        g.tenant = TENANT
        assert db.context_product() == "other"


def test_every_tenant_read_starts_from_the_org():
    sql = str(tenant_select(EntityDefinition, "org-a").compile(dialect=postgresql.dialect()))
    assert "WHERE product.entity_definitions.org_id = %(org_id_1)s" in sql


def test_tenant_as_dict_is_the_identity_shape():
    assert TENANT.as_dict() == {"orgId": "org-a", "userId": "u", "email": "u@x.io", "role": None,
                                "scopes": ["read"], "product": "other"}


def test_unknown_products_are_403_known_ones_pass(app):
    with app.app_context():
        products.require("default")
        with pytest.raises(Forbidden, match="Unknown product"):
            products.require("no_such_product")


def test_each_app_knows_the_products_of_its_own_database(app, make_app, database_url):
    """Two apps in one process on two databases: each answers from its own database's products (the
    cache was one per process: the second app saw the first one's products for 30 s)."""
    import uuid

    from sqlalchemy import create_engine, insert, text
    from sqlalchemy.engine import make_url

    from app.platform_models import Product
    from app.wire import utcnow

    name = f"pg_products_{uuid.uuid4().hex[:8]}"
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    other_url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    other_engine = create_engine(other_url)
    try:
        with other_engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA platform"))
            Product.__table__.create(conn)
            conn.execute(insert(Product.__table__).values(slug="only_there", name="Only there",
                                                          schema_name="product_only_there", created_at=utcnow()))
        other = make_app(DATABASE_URL=other_url)
        with app.app_context():
            products.require("default")  # the session database's products are cached ...
        with other.app_context():
            products.require("only_there")
            with pytest.raises(Forbidden, match="Unknown product"):  # ... and are not the other database's
                products.require("default")
        with app.app_context(), pytest.raises(Forbidden, match="Unknown product"):
            products.require("only_there")
    finally:
        other_engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
