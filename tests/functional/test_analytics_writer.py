"""The set-based SQL writer (app.analytics.writer) against the from-scratch reference (property test).

Random chat facts, with retries/redeliveries and late arrivals, are split into random batches and
stored through `services.write_batch` in real PostgreSQL; the rollups, usage and user sets read back
must equal `reference()` (the definitions of app.analytics.rollup) computed over the distinct facts.
"""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.analytics.models import AnalyticsDailyUser, AnalyticsRollup, AnalyticsUsage
from app.analytics.rollup import ROLLUP_COLUMNS, USAGE_COLUMNS
from tests.unit.analytics.test_rollup import fact_strategy, reference


def _event(fact, org: str) -> dict:
    props = {"chatId": fact.chat_id, "agentId": fact.agent_id, "channel": fact.channel}
    if fact.event_type == "message":
        props.update(direction="inbound" if fact.inbound else "outbound", service=fact.service, model=fact.model,
                     inputTokens=fact.input_tokens, outputTokens=fact.output_tokens, cost=float(fact.cost))
    if fact.event_type == "csat":
        props["score"] = fact.score
    return {"product": "default", "org_id": org, "event_id": fact.event_id, "session_id": "s",
            "user_id": fact.user_id, "event_type": fact.event_type, "event_category": "chat", "page_path": None,
            "properties": props, "occurred_at": fact.at}


def _read(session, orgs: dict[str, str]):
    back = {v: k for k, v in orgs.items()}

    def table(model, keys, columns):
        out = {}
        for row in session.execute(select(model).where(model.org_id.in_(list(orgs.values())))).scalars():
            values = {c: getattr(row, c) for c in columns}
            if any(values.values()):
                out[(back[row.org_id], *(getattr(row, k) for k in keys))] = values
        return out

    users = {(back[u.org_id], u.day, u.agent_id, u.channel, u.user_id) for u in session.execute(
        select(AnalyticsDailyUser).where(AnalyticsDailyUser.org_id.in_(list(orgs.values())))).scalars()}
    return (table(AnalyticsRollup, ("day", "agent_id", "channel"), ROLLUP_COLUMNS),
            table(AnalyticsUsage, ("day", "service", "model"), USAGE_COLUMNS), users)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(fact_strategy, min_size=1, max_size=30), st.randoms(use_true_random=False),
       st.integers(1, 5), st.integers(0, 8))
def test_sql_writer_equals_the_reference(app, raw, rnd, n_batches, n_duplicates):
    from app.analytics.services import write_batch
    from app.db import db

    facts = [dataclasses.replace(f, event_id=f"e{i:03d}") for i, f in enumerate(raw)]
    arrivals = facts + [rnd.choice(facts) for _ in range(n_duplicates)]
    rnd.shuffle(arrivals)
    cuts = sorted(rnd.randint(0, len(arrivals)) for _ in range(n_batches - 1))
    batches = [arrivals[a:b] for a, b in zip([0, *cuts], [*cuts, len(arrivals)], strict=True)]
    orgs = {o: f"w-{uuid.uuid4().hex[:10]}-{o}" for o in ("o1", "o2")}
    with app.app_context():
        stored = 0
        for batch in batches:
            with db.product_session("default") as session:
                stored += write_batch(session, [_event(f, orgs[f.org_id]) for f in batch])
        assert stored == len(facts)
        with db.product_session("default") as session:
            assert _read(session, orgs) == reference(facts)


def test_lines_that_are_not_json_objects_are_set_aside_and_the_rest_stored(app):
    """The writer parses each line once when the batch is clean; a line PostgreSQL refuses makes it redo
    the batch with such lines set aside (returned to the caller, which parks them)."""
    import json

    from sqlalchemy import text

    from app.analytics.tasks import write_lines_by_product
    from app.db import db

    org = f"w-{uuid.uuid4().hex[:10]}"
    good = [json.dumps({"product": "default", "org_id": org, "event_id": f"g{i}", "session_id": "s", "user_id": "u",
                        "event_type": "page_view", "event_category": "nav", "page_path": None, "properties": None,
                        "occurred_at": "2026-03-01T10:00:00Z"}).replace(" ", "").encode() for i in range(3)]
    broken = b'{"product":"default","org_id":"' + org.encode() + b'","event_id":"x"'
    scalar = b'{"product":"default"}'[:-1] + b',"x":[1,2'
    with app.app_context():
        clean, dead = write_lines_by_product(good[:1])
        assert (clean, dead) == (1, [])
        stored, dead = write_lines_by_product([good[1], broken, scalar, good[2], good[1]])
        assert stored == 2 and sorted(dead) == sorted([broken, scalar])
        with db.product_session("default") as session:
            ids = session.execute(text("SELECT event_id FROM product_default.analytics_events WHERE org_id = :o "
                                       "ORDER BY 1"), {"o": org}).scalars().all()
        assert ids == ["g0", "g1", "g2"]


def test_costs_summing_past_a_trillion_are_stored_not_set_aside(app):
    """One message may cost up to 1e9; 1 100 of them in one chat (and one rollup row) sum past what
    numeric(18,6) holds. The batch is stored exactly, and another org's events in it are not lost."""
    import json

    from sqlalchemy import text

    from app.analytics.tasks import write_lines_by_product
    from app.db import db

    org, other = f"w-{uuid.uuid4().hex[:10]}", f"w-{uuid.uuid4().hex[:10]}"

    def line(org_id, i, props, event_type="message"):
        return json.dumps({"product": "default", "org_id": org_id, "event_id": f"e{i}", "session_id": "s",
                           "user_id": "u", "event_type": event_type, "event_category": "chat", "page_path": None,
                           "properties": props, "occurred_at": "2026-03-01T10:00:00Z"}).encode()

    costly = {"chatId": "c1", "agentId": "a", "channel": "web", "direction": "outbound", "service": "chat",
              "model": "m", "inputTokens": 1, "outputTokens": 1, "cost": 1e9}
    lines = [line(org, i, costly) for i in range(1100)] + [line(other, 0, {**costly, "cost": 0.5})]
    with app.app_context():
        stored, dead = write_lines_by_product(lines)
        assert (stored, dead) == (1101, [])
        with db.product_session("default") as session:
            chat = session.execute(text("SELECT cost FROM product_default.analytics_chats WHERE org_id = :o"),
                                   {"o": org}).scalar_one()
            rollup = session.execute(text("SELECT sum(cost) FROM product_default.analytics_rollup "
                                          "WHERE org_id = :o"), {"o": org}).scalar_one()
            others = session.execute(text("SELECT sum(cost) FROM product_default.analytics_usage "
                                          "WHERE org_id = :o"), {"o": other}).scalar_one()
    assert chat == rollup == 1_100_000_000_000 and others == 0.5
