"""GatewayFlask.ensure_sync: Flask's answer (the function itself, or the async wrapper for a coroutine
function), remembered per code object."""

from __future__ import annotations

import functools

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
