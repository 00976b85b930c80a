"""The byte budget of a list page, one rule for every `limit` + `nextCursor` list (the agent registry's
lists, app.agents.services.paging, and the entity store's definition and view lists): a page holds at
most `limit` items and ends before the item that would take it past the list's budget setting (and
never past what one response may carry, MAX_RESPONSE_BYTES less an allowance for the wrapper). The
sizes are measured by PostgreSQL beside the page query (a running sum over the page's order), so an item
that does not go on the page is not even sent to the app. The first item of a page always goes on it,
however large, so a walk always moves on."""

from __future__ import annotations

from flask import current_app
from sqlalchemy import BigInteger, and_, case, func, literal, or_, select

WRAPPER_ALLOWANCE = 64 * 1024  # room for the list's key, nextCursor (and the like) in a response
UNLIMITED = 2**62
# an entity-store item's bytes on a list page beside its unbounded columns (ids, names, times, flags and
# their keys), rounded up: its size is measured by PostgreSQL as those columns' bytes plus this
ITEM_FIXED_BYTES = 1024


def bounds(limit: int | None, default_setting: str, budget_setting: str) -> tuple[int, int, int]:
    """(limit, page byte budget, largest item a list may serve) of a list whose default limit and byte
    budget are the app's settings `default_setting` and `budget_setting` (0: no budget of its own)."""
    config = current_app.config
    limit = int(limit or config[default_setting])
    response_cap = int(config.get("MAX_RESPONSE_BYTES") or 0)
    servable = max(response_cap - WRAPPER_ALLOWANCE, 1024) if response_cap else UNLIMITED
    budget = min(int(config[budget_setting]) or UNLIMITED, servable)
    return limit, budget, servable


def running_bytes(size, order, servable: int = UNLIMITED):
    """The bytes of the page up to and including each row, in `order` (rows above `servable` count for
    nothing: a list that skips them, the registry's, goes on past them)."""
    return func.sum(case((size <= _bytes(servable), size), else_=0)).over(order_by=order)


def on_page(n, size, running, limit: int, budget: int, servable: int = UNLIMITED):
    """Whether row number `n` (1-based, in the page's order) of `size` bytes, `running` bytes of the page
    up to it, goes on the page: within the limit, servable, and within the budget or the page's first."""
    return and_(n <= limit, size <= _bytes(servable), or_(running <= _bytes(budget), running == size))


def _bytes(value: int):
    """A byte count as a bigint parameter (a size typed integer would bind UNLIMITED as one, and fail)."""
    return literal(value, BigInteger)


def page_rows(session, model, stmt, order, limit: int, budget: int) -> tuple[list, bool]:
    """The rows of `model` on a page within `limit` and the byte budget, and whether more follow.
    `stmt` selects `id`, the columns of `order` (the list's order, columns of `model`) and `size` (the
    item's bytes) of at most `limit + 1` rows; the page's rows are then loaded whole in one statement,
    the others never leave PostgreSQL. Every item is served (the response cap, a 413, covers a page
    whose one item is larger than a response)."""
    rows = stmt.subquery()
    window = tuple(rows.c[column.key] for column in order)
    sized = select(rows.c.id, rows.c.size, running_bytes(rows.c.size, window).label("running"),
                   func.row_number().over(order_by=window).label("n"),
                   func.count().over().label("fetched")).subquery()
    fits = on_page(sized.c.n, sized.c.size, sized.c.running, limit, budget)
    found = session.execute(select(model, sized.c.fetched).join(sized, model.id == sized.c.id).where(fits)
                            .order_by(sized.c.n)).all()
    return [row[0] for row in found], bool(found) and found[0].fetched > len(found)
