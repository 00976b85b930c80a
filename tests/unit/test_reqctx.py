"""The per-request layer without Flask's proxies (app.reqctx and its users): the same objects and answers
as through `request` / `g` / `current_app`, the Tenant remembered per verified claims, a plain
MethodView dispatched as Flask dispatches it."""

from __future__ import annotations

import pytest
from flask import current_app, g, request
from flask.views import MethodView

from app import GatewayFlask
from app.extensions import _dispatch_method_view, _plain_method_view
from app.reqctx import app_object, app_or_none, current_g, current_request, g_or_none, request_or_none


def test_the_objects_are_the_proxies_objects_and_outside_a_context_the_same_error():
    app = GatewayFlask(__name__)
    assert request_or_none() is None and g_or_none() is None and app_or_none() is None
    for read, proxy in ((current_request, request), (current_g, g), (app_object, current_app)):
        with pytest.raises(RuntimeError) as ours:
            read()
        with pytest.raises(RuntimeError) as flasks:
            proxy._get_current_object()
        assert str(ours.value) == str(flasks.value)
    with app.app_context():
        assert current_g() is g._get_current_object() and g_or_none() is current_g()
        assert app_object() is app and app_or_none() is app
        assert request_or_none() is None
        with app.test_request_context("/x?a=1"):
            assert current_request() is request._get_current_object() and request_or_none() is current_request()


def test_the_tenant_is_built_once_per_claims_and_default_product(app, monkeypatch):
    import app.auth as auth

    built = []
    make = auth.tenant_from_claims
    monkeypatch.setattr(auth, "tenant_from_claims", lambda claims, config=None: built.append(1) or make(claims, config))
    claims = {"org_id": "o1", "user_id": "u1", "scopes": ["read"]}
    with app.app_context():
        config = app.config
        first = auth._tenant_of(claims, config)
        assert auth._tenant_of(claims, config) is first and len(built) == 1
        assert auth._tenant_of(dict(claims), config) == first and len(built) == 2  # another dict: built again
        monkeypatch.setitem(config, "DEFAULT_PRODUCT", "other")
        assert auth._tenant_of(claims, config).product == "other" and len(built) == 3


class _Things(MethodView):
    def get(self, thing_id):
        return f"get {thing_id}"

    def post(self, thing_id):
        return f"post {thing_id}"


class _Decorated(_Things):
    decorators = [lambda view: view]


class _Shared(_Things):
    init_every_request = False


class _OwnDispatch(_Things):
    def dispatch_request(self, **kwargs):
        return "own"


def test_only_a_plain_method_view_takes_the_short_dispatch():
    assert _plain_method_view(_Things.as_view("things"))
    assert not _plain_method_view(_Things.as_view("things", 1))  # constructor arguments
    assert not _plain_method_view(_Decorated.as_view("decorated"))
    assert not _plain_method_view(_Shared.as_view("shared"))
    assert not _plain_method_view(_OwnDispatch.as_view("own"))
    assert not _plain_method_view(lambda **kwargs: None)


@pytest.mark.parametrize("method", ["GET", "POST", "HEAD", "PUT"])
def test_the_short_dispatch_answers_as_flask(method):
    app = GatewayFlask(__name__)
    view = _Things.as_view("things")
    with app.test_request_context("/things/7", method=method):
        try:
            expected = view(thing_id="7")
        except AssertionError as exc:  # no such method: Flask's assertion
            with pytest.raises(AssertionError) as ours:
                _dispatch_method_view(view.view_class, {"thing_id": "7"})
            assert str(ours.value) == str(exc)
            return
        assert _dispatch_method_view(view.view_class, {"thing_id": "7"}) == expected
