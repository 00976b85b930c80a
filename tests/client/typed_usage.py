"""Checked by mypy --strict (tests/client/test_generated.py), never run: how a caller's code types with the
client. A wrong field name or type here is a type error, which is what the models are for."""

from __future__ import annotations

from platform_gateway_client import AsyncClient, Client, Tagged
from platform_gateway_client.models import Agent, PaginatedResult, Record


def sync_usage(api: Client) -> list[str]:
    record: Record = api.entities.records.create("deals", {"name": "ACME", "fields": {"title": "ACME"}})
    tagged: Tagged[Record] = api.entities.records.get_tagged("deals", record["id"])
    if tagged.etag:
        api.entities.records.update("deals", record["id"], {"fields": {"stage": "won"}}, if_match=tagged.etag)
    page: PaginatedResult = api.entities.records.query("deals", filters={"stage": "won"}, sort_order="desc")
    total: int = page["totalCount"]
    names = [r["name"] for r in api.entities.records.iter("deals") if "name" in r]
    agent: Agent = api.agents.create({"name": "a", "title": "A", "type": "chat", "provider": "p", "model": "m"})
    return [*names, agent["name"], str(total)]


async def async_usage(api: AsyncClient) -> list[str]:
    ids = [a["id"] async for a in api.agents.iter(page_size=50)]
    job = await api.jobs.wait((await api.entities.records.start_bulk_create("deals", [{"fields": {}}]))["jobId"])
    return [*ids, job["status"]]
