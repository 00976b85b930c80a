"""Analytics through HTTP: ingest (inline and with a real worker), chat facts, every dashboard,
global and per-channel roll-ups, date windows, isolation by org and product."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import wait_for

API = "/api/v1/analytics"
DAY = "2026-03-10"


def chat_events(chat: str, *, user="u1", agent="agent-1", channel="web", day=DAY, hour=10, messages=2,
                csat=None, tokens=(10, 20), cost=0.01, name="Agent One"):
    """One chat as the chat service reports it: started, messages, ended, csat."""
    base = {"sessionId": f"s-{chat}", "userId": user, "eventCategory": "chat"}
    props = {"chatId": chat, "agentId": agent, "agentName": name, "channel": channel}
    out = [{**base, "eventId": f"{chat}-start", "eventType": "chat_started",
            "timestamp": f"{day}T{hour:02d}:00:00Z", "properties": props}]
    for i in range(messages):
        out.append({**base, "eventId": f"{chat}-m{i}", "eventType": "message",
                    "timestamp": f"{day}T{hour:02d}:0{i + 1}:00Z",
                    "properties": {**props, "direction": "inbound" if i % 2 == 0 else "outbound",
                                   "model": "gpt-x", "service": "chat", "inputTokens": tokens[0],
                                   "outputTokens": tokens[1], "cost": cost}})
    out.append({**base, "eventId": f"{chat}-end", "eventType": "chat_ended",
                "timestamp": f"{day}T{hour:02d}:10:00Z", "properties": props})
    if csat is not None:
        out.append({**base, "eventId": f"{chat}-csat", "eventType": "csat",
                    "timestamp": f"{day}T{hour:02d}:11:00Z", "properties": {**props, "score": csat}})
    return out


def post_all(client, headers, events):
    for event in events:
        r = client.post(f"{API}/events", json=event, headers=headers)
        assert r.status_code == 202, r.get_json()


def get(client, headers, path, **params):
    r = client.get(f"{API}/{path}", query_string=params, headers=headers)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["success"] is True
    return body["data"]


WINDOW = {"from": DAY, "to": DAY}


def test_inline_ingest_feeds_every_dashboard(client, auth):
    h = auth("read", "write")
    post_all(client, h, chat_events("c1", csat=5) + chat_events("c2", user="u2", csat=3, hour=11)
             + chat_events("c3", user="u1", agent="agent-2", channel="whatsapp", messages=4, hour=12))
    post_all(client, h, [{"sessionId": "s", "userId": "u9", "eventType": "page_view",
                          "eventCategory": "navigation", "pagePath": "/x", "timestamp": f"{DAY}T09:00:00Z"}])
    s = get(client, h, "summary", **WINDOW)
    assert s == {"total_chats": 3, "total_messages": 8, "total_tokens": 240, "total_cost": 0.08,
                 "unique_users": 2, "avg_session_duration": 600.0}  # csat does not lengthen a chat
    chats = get(client, h, "chats", **WINDOW)
    assert [c["chat_id"] for c in chats] == ["c3", "c2", "c1"]
    assert chats[2] == {"chat_id": "c1", "agent_id": "agent-1", "user_id": "u1", "message_count": 2,
                        "total_tokens": 60, "duration_secs": 600.0, "csat_score": 5.0,
                        "created_at": f"{DAY}T10:00:00.000Z"}
    assert [c["chat_id"] for c in get(client, h, "chats", agent_id="agent-2", **WINDOW)] == ["c3"]
    agents = {a["agent_id"]: a for a in get(client, h, "agents", **WINDOW)}
    assert agents["agent-1"] == {"agent_id": "agent-1", "agent_name": "Agent One", "total_chats": 2,
                                 "total_messages": 4, "total_tokens": 120, "avg_duration_secs": 600.0,
                                 "unique_users": 2, "avg_csat": 4.0}
    assert agents["agent-2"]["avg_csat"] is None
    assert get(client, h, "usage", **WINDOW) == [
        {"service": "chat", "model": "gpt-x", "input_tokens": 80, "output_tokens": 160, "total_tokens": 240,
         "cost": 0.08, "request_count": 8}]
    assert get(client, h, "daily", **WINDOW) == [
        {"date": DAY, "total_chats": 3, "total_messages": 8, "total_tokens": 240, "unique_users": 2}]
    events = get(client, h, "events", **WINDOW)
    assert len(events) == 17 and events[-1]["eventType"] == "page_view"
    assert set(events[0]) == {"eventId", "orgId", "sessionId", "userId", "eventType", "eventCategory",
                              "pagePath", "timestamp", "properties"}
