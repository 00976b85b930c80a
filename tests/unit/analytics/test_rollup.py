"""Rollup arithmetic against a reference computed from raw facts (property test).

Events (with duplicates and late arrivals) are split into random batches in random order; each batch
goes through `plan_batch` exactly as the writer applies it (only first-time events, the current chat
rows, deltas added, user sets unioned). The resulting rollups must equal what a from-scratch
computation over the distinct raw events gives, for every bucket.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from app.analytics.rollup import ROLLUP_COLUMNS, USAGE_COLUMNS
from tests.unit.analytics.reference import ChatFact, money, plan_batch, utc_day

T0 = datetime(2026, 3, 1, 22, tzinfo=UTC)

fact_strategy = st.builds(
    lambda org, chat, kind, user, minutes, agent, channel, inbound, tin, tout, cost, score, model: ChatFact(
        org_id=org, event_id="", event_type=kind, chat_id=chat, user_id=user,
        at=T0 + timedelta(minutes=minutes, microseconds=minutes * 7), agent_id=agent, channel=channel,
        inbound=inbound if kind == "message" else False, model=model if kind == "message" else "unknown",
        input_tokens=tin if kind == "message" else 0, output_tokens=tout if kind == "message" else 0,
        cost=money(cost) if kind == "message" else Decimal(0), score=score if kind == "csat" else None),
    st.sampled_from(["o1", "o2"]), st.sampled_from(["c1", "c2", "c3", "c4"]),
    st.sampled_from(["chat_started", "message", "message", "chat_ended", "csat"]),
    st.sampled_from(["u1", "u2", "u3"]), st.integers(0, 60 * 50), st.sampled_from(["", "a1", "a2"]),
    st.sampled_from(["web", "sms"]), st.booleans(), st.integers(0, 500), st.integers(0, 500),
    st.floats(0, 2, allow_nan=False).map(lambda x: round(x, 7)), st.integers(1, 5), st.sampled_from(["m1", "m2"]))


def reference(facts: list[ChatFact]):
    """Rollups computed from scratch from the distinct raw facts (the definitions of app.analytics.rollup)."""
    rollup = defaultdict(lambda: defaultdict(int))
    usage = defaultdict(lambda: defaultdict(int))
    users = set()
    by_chat = defaultdict(list)
    for f in facts:
        bucket = (f.org_id, f.day, f.agent_id, f.channel)
        users.add((*bucket, f.user_id))
        by_chat[(f.org_id, f.chat_id)].append(f)
        if f.event_type == "message":
            row = rollup[bucket]
            row["messages"] += 1
            row["inbound_messages"] += int(f.inbound)
            row["input_tokens"] += f.input_tokens
            row["output_tokens"] += f.output_tokens
            row["total_tokens"] += f.input_tokens + f.output_tokens
            row["cost"] += f.cost
            u = usage[(f.org_id, f.day, f.service, f.model)]
            for name, value in (("input_tokens", f.input_tokens), ("output_tokens", f.output_tokens),
                                ("total_tokens", f.input_tokens + f.output_tokens), ("cost", f.cost),
                                ("request_count", 1)):
                u[name] += value
    for (org, _chat), chat_facts in by_chat.items():
        first = min(chat_facts, key=lambda f: f.order)
        non_csat = [f.at for f in chat_facts if f.event_type != "csat"]
        duration = (max(non_csat) - first.at) if non_csat else timedelta(0)
        csats = [f for f in chat_facts if f.event_type == "csat"]
        row = rollup[(org, utc_day(first.at), first.agent_id, first.channel)]
        row["chats"] += 1
        row["duration_us"] += duration // timedelta(microseconds=1)
        if csats:
            row["csat_sum"] += max(csats, key=lambda f: f.order).score
            row["csat_count"] += 1
    return _clean(rollup, ROLLUP_COLUMNS), _clean(usage, USAGE_COLUMNS), users


def _clean(table, columns):
    return {k: {c: v.get(c, 0) for c in columns} for k, v in table.items() if any(v.values())}


def incremental(batches: list[list[ChatFact]]):
    """What the writer does, batch after batch, with state kept in dicts instead of tables."""
    stored: set[tuple[str, str]] = set()
    chats: dict = {}
    rollup = defaultdict(lambda: defaultdict(int))
    usage = defaultdict(lambda: defaultdict(int))
    users: set = set()
    for batch in batches:
        new = []
        for f in batch:  # INSERT … ON CONFLICT DO NOTHING RETURNING: first time only
            if (f.org_id, f.event_id) not in stored:
                stored.add((f.org_id, f.event_id))
                new.append(f)
        if not new:
            continue
        plan = plan_batch(new, {k: chats[k] for k in {(f.org_id, f.chat_id) for f in new} if k in chats})
        for target, deltas in ((rollup, plan.rollup), (usage, plan.usage)):
            for key, values in deltas.items():
                for name, value in values.items():
                    target[key][name] += value
        users |= plan.users
        chats.update(plan.chats)
    return _clean(rollup, ROLLUP_COLUMNS), _clean(usage, USAGE_COLUMNS), users


@settings(max_examples=300, deadline=None)
@given(st.lists(fact_strategy, min_size=1, max_size=40), st.randoms(use_true_random=False),
       st.integers(1, 6), st.integers(0, 10))
def test_incremental_rollups_equal_the_reference(raw, rnd, n_batches, n_duplicates):
    facts = [dataclasses.replace(f, event_id=f"e{i:03d}") for i, f in enumerate(raw)]
    arrivals = facts + [rnd.choice(facts) for _ in range(n_duplicates)]  # retries and redeliveries
    rnd.shuffle(arrivals)                                                # late events
    cuts = sorted(rnd.randint(0, len(arrivals)) for _ in range(n_batches - 1))
    batches = [arrivals[a:b] for a, b in zip([0, *cuts], [*cuts, len(arrivals)], strict=True)]
    assert incremental(batches) == reference(facts)


def test_late_event_moves_a_chat_to_its_new_start_day():
    day1 = datetime(2026, 3, 2, 10, tzinfo=UTC)
    later = ChatFact("o", "e2", "message", "c", "u", day1, agent_id="a", channel="web", input_tokens=3)
    plan1 = plan_batch([later], {})
    assert plan1.rollup[("o", day1.date(), "a", "web")]["chats"] == 1
    early = ChatFact("o", "e1", "chat_started", "c", "u0", day1 - timedelta(days=1), agent_id="b", channel="sms")
    plan2 = plan_batch([early], {("o", "c"): plan1.chats[("o", "c")]})
    assert plan2.rollup[("o", day1.date(), "a", "web")] == {**{c: 0 for c in ROLLUP_COLUMNS}, "cost": Decimal(0),
                                                            "chats": -1}
    moved = plan2.rollup[("o", (day1 - timedelta(days=1)).date(), "b", "sms")]
    assert moved["chats"] == 1 and moved["duration_us"] == 86400 * 10**6
    assert plan2.chats[("o", "c")].user_id == "u0"


def test_money_is_exact_and_rounds_like_postgres():
    assert money(0.1) + money(0.2) == Decimal("0.300000")
    assert money(0.0000005) == Decimal("0.000001") and money(None) == 0
