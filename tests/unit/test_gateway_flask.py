"""GatewayFlask.ensure_sync: Flask's answer (the function itself, or the async wrapper for a coroutine
function), remembered per code object."""

from __future__ import annotations

import functools

import pytest

from app import GatewayFlask


def test_ensure_sync_gives_flasks_answer_and_remembers_it_per_code_object(monkeypatch):
    app = GatewayFlask(__name__)
    wrapped = []
    monkeypatch.setattr(app, "async_to_sync", lambda func: wrapped.append(func) or ("wrapped", func))

    def plain():
        return 1

    async def coroutine():
        return 2

    def make(n):
        def closure():
            return n
        return closure

    class View:
        def get(self):
            return 3

        async def post(self):
            return 4

    assert app.ensure_sync(plain) is plain
    assert app.ensure_sync(coroutine) == ("wrapped", coroutine)
    closures = [make(n) for n in range(50)]
    assert all(app.ensure_sync(c) is c for c in closures)
    view = View()
    assert app.ensure_sync(view.get) == view.get
    assert app.ensure_sync(view.post) == ("wrapped", view.post)
    assert app.ensure_sync(coroutine) == ("wrapped", coroutine)  # remembered: still wrapped
    # one entry per function written, however many closures or bound methods were asked about
    assert len(app._coroutine_code) == 5
    partial = functools.partial(coroutine)
    assert app.ensure_sync(partial) == ("wrapped", partial)  # not a plain function: asked as Flask asks
    assert len(app._coroutine_code) == 5
    # a plain function answered once is found by itself (no code-object lookup); a coroutine never is
    assert plain in app._sync_functions and coroutine not in app._sync_functions
    monkeypatch.setattr(app, "_coroutine_code", {})
    assert app.ensure_sync(plain) is plain and app._coroutine_code == {}
    assert app.ensure_sync(coroutine) == ("wrapped", coroutine)
    monkeypatch.setattr("app.SYNC_FUNCTIONS_CACHE_SIZE", 10)
    for closure in [make(n) for n in range(30)]:
        assert app.ensure_sync(closure) is closure
    assert len(app._sync_functions) <= 10


def _adapter_fields(adapter):
    return {name: getattr(adapter, name) for name in ("server_name", "script_name", "subdomain", "url_scheme",
                                                      "path_info", "default_method", "query_args", "websocket")}


def test_url_adapter_is_the_one_flask_binds_for_every_kind_of_host_and_path():
    """GatewayFlask.create_url_adapter remembers what it derives from the host: the adapter it builds (and
    `request.host`) are field for field Flask's own, the first time and from the cache, and a host werkzeug
    refuses is refused as before."""
    from flask import Flask
    from werkzeug.exceptions import BadHost
    from werkzeug.test import EnvironBuilder

    app = GatewayFlask(__name__)
    cases = [
        {"path": "/api/v1/me", "headers": {"Host": "API.Example.com:8000"}},
        {"path": "/api/v1/me", "headers": {"Host": "api.example.com:80"}, "query_string": "a=1&b=%C3%A9"},
        {"path": "/caf\u00e9/x", "base_url": "https://gw.example.com:443/prefix", "method": "POST"},
        {"path": "/x", "headers": {"Host": "b\u00fccher.example"}},
        {"path": "/x", "headers": {"Host": "bad host\x01"}},
        {"path": "/x", "base_url": "http://[::1]:8080/"},
    ]
    for case in cases:
        for _ in range(2):  # the second time from the cache
            theirs_request = app.request_class(EnvironBuilder(**case).get_environ())
            ours_request = app.request_class(EnvironBuilder(**case).get_environ())
            theirs = Flask.create_url_adapter(app, theirs_request)
            ours = app.create_url_adapter(ours_request)
            assert _adapter_fields(ours) == _adapter_fields(theirs), case
            assert ours.map is theirs.map
            assert ours_request.host == theirs_request.host
    assert len(app._bound_hosts) >= 4  # the hosts were remembered (then served from the cache)
    environ = EnvironBuilder(path="/x", headers={"Host": "a" * 64 + ".example"}).get_environ()  # IDNA refuses
    with pytest.raises(BadHost):
        Flask.create_url_adapter(app, app.request_class(dict(environ)))
    for _ in range(2):
        with pytest.raises(BadHost):
            app.create_url_adapter(app.request_class(dict(environ)))
    # a websocket upgrade: werkzeug's scheme change
    upgrade = {"path": "/ws", "headers": {"Host": "x", "Connection": "Upgrade", "Upgrade": "websocket"}}
    theirs = Flask.create_url_adapter(app, app.request_class(EnvironBuilder(**upgrade).get_environ()))
    ours = app.create_url_adapter(app.request_class(EnvironBuilder(**upgrade).get_environ()))
    assert _adapter_fields(ours) == _adapter_fields(theirs) and ours.url_scheme == "ws"
