"""`flask analytics demo`: realistic chat, message, CSAT and page-view facts for one org, sent through
the real ingest path (the AnalyticsEvent schema, `normalise_event`, then the Redis buffer and worker
when REDIS_URL is set, else the same batch writer inline)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext

from app.analytics import services, tasks
from app.analytics.schemas import AnalyticsEventSchema
from app.db import product_slug
from app.tenancy import Tenant, products

AGENTS = [("support-bot", "Support Bot", "gpt-4o-mini", 0.15, 0.60),
          ("sales-assistant", "Sales Assistant", "gpt-4o", 2.50, 10.00),
          ("onboarding-guide", "Onboarding Guide", "claude-haiku", 0.80, 4.00)]
CHANNELS = [("web", 60), ("whatsapp", 20), ("email", 10), ("slack", 5), ("sms", 5)]
PAGES = ["/", "/pricing", "/docs", "/dashboard", "/settings", "/help"]


def demo_events(org: str, days: int, chats: int, seed: int | None = None,
                now: datetime | None = None) -> list[dict[str, Any]]:
    """AnalyticsEvent bodies (camelCase) for `chats` chats spread over the last `days` days."""
    rnd = random.Random(seed)
    now = now or datetime.now(UTC)
    users = [f"user-{i:04d}" for i in range(max(3, chats // 3))]
    events: list[dict[str, Any]] = []
    channels, weights = zip(*CHANNELS, strict=True)
    for n in range(chats):
        day = now - timedelta(days=rnd.randrange(days))
        start = day.replace(hour=rnd.choice(range(7, 22)), minute=rnd.randrange(60), second=rnd.randrange(60),
                            microsecond=0)
        if start > now:
            start -= timedelta(days=1)
        agent, name, model, price_in, price_out = rnd.choice(AGENTS)
        user, session, chat = rnd.choice(users), uuid.uuid4().hex[:12], f"chat-{uuid.uuid4().hex[:12]}"
        channel = rnd.choices(channels, weights)[0]
        props = {"chatId": chat, "agentId": agent, "agentName": name, "channel": channel}
        base = {"sessionId": session, "userId": user, "eventCategory": "chat"}
        at = start
        if channel == "web":
            for page in rnd.sample(PAGES, rnd.randint(1, 3)):
                events.append({"sessionId": session, "userId": user, "eventType": "page_view",
                               "eventCategory": "navigation", "pagePath": page, "timestamp": _ts(at)})
                at += timedelta(seconds=rnd.randint(5, 90))
        events.append({**base, "eventType": "chat_started", "timestamp": _ts(at), "properties": props})
        for i in range(rnd.randint(1, 7) * 2):
            at += timedelta(seconds=rnd.randint(4, 120))
            inbound = i % 2 == 0
            tin = 0 if inbound else rnd.randint(200, 1500)
            tout = 0 if inbound else rnd.randint(40, 600)
            cost = round((tin * price_in + tout * price_out) / 1_000_000, 6)
            events.append({**base, "eventType": "message", "timestamp": _ts(at), "properties": {
                **props, "direction": "inbound" if inbound else "outbound", "model": model, "service": "chat",
                "inputTokens": tin, "outputTokens": tout, "cost": cost}})
        at += timedelta(seconds=rnd.randint(5, 60))
        events.append({**base, "eventType": "chat_ended", "timestamp": _ts(at), "properties": props})
        if rnd.random() < 0.4:
            events.append({**base, "eventType": "csat", "timestamp": _ts(at + timedelta(seconds=30)),
                           "properties": {**props, "score": rnd.choices([1, 2, 3, 4, 5], [3, 5, 12, 35, 45])[0]}})
        if n % 500 == 499:
            click.echo(f"  generated {n + 1} chats", err=True)
    return events


def _ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def ingest_bodies(bodies: list[dict[str, Any]], org: str, product: str) -> int:
    """Validate and ingest AnalyticsEvent bodies as POST /events would for a token of `org`."""
    tenant = Tenant(org_id=org, user_id="demo", email=None, role=None, product=product)
    schema = AnalyticsEventSchema()
    events = [services.normalise_event(schema.load(body), tenant) for body in bodies]
    if current_app.config.get("REDIS_URL"):
        for i in range(0, len(events), 500):
            tasks.submit_many(events[i:i + 500])
        return len(events)
    return sum(tasks.write_inline(events[i:i + 2000]) for i in range(0, len(events), 2000))


analytics_cli = click.Group("analytics", help="Analytics tools.")


@analytics_cli.command("demo")
@click.option("--org", required=True, help="org_id the facts belong to (the token's org_id)")
@click.option("--days", default=30, show_default=True, type=click.IntRange(1, 3650))
@click.option("--chats", default=300, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--product", default=None, help="product (default: DEFAULT_PRODUCT)")
@click.option("--seed", default=None, type=int, help="random seed (repeatable data)")
@with_appcontext
def demo(org: str, days: int, chats: int, product: str | None, seed: int | None) -> None:
    """Generate realistic chat, message, CSAT and page-view facts through the real ingest path."""
    product = product_slug(product or current_app.config["DEFAULT_PRODUCT"])
    products.require(product)
    bodies = demo_events(org, days, chats, seed)
    count = ingest_bodies(bodies, org, product)
    how = "queued for the analytics worker" if current_app.config.get("REDIS_URL") else "stored"
    click.echo(f"{len(bodies)} events for {chats} chats over {days} days: {count} {how} (org {org}, "
               f"product {product})")
