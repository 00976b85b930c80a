"""The analytics console in a real browser (Debian's headless Chromium through Selenium), against a
real HTTP server of the app with known analytics data in a product of its own.

What it proves: the page signs in, draws totals, the daily chart, the agents and usage tables from
the public analytics API; the date picker changes them; the platform view shows orgs and channels;
an expired token is refreshed from the console session (and a short-lived one before it expires).
Skipped only where chromium/chromium-driver are missing (.ci/run installs them; with
REQUIRE_SERVICES=1 a missing browser fails instead).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
import uuid

import pytest

from tests.browser_support import chromium_driver, chromium_paths, live_server
from tests.conftest import ROOT
from tests.support import bearer, token

TODAY = dt.datetime.now(dt.UTC).date()


def day(offset: int) -> str:
    return (TODAY + dt.timedelta(days=offset)).isoformat()


def at(offset: int, clock: str) -> str:
    return f"{day(offset)}T{clock}Z"


# Three chats of org A (two in the last 7 days, one 20 days ago) and one of org B.
# chat: (chatId, day offset, agentId, agentName, userId, channel, [(in, out, cost, model)], seconds)
CHATS_A = [
    ("c1", -1, "ag-support", "Support bot", "u1", "web",
     [(100, 20, 0.5, "model-large"), (200, 80, 1.0, "model-large")], 120),
    ("c2", -3, "ag-sales", "Sales helper", "u2", "whatsapp", [(50, 25, 0.25, "model-small")], 60),
    ("c3", -20, "ag-support", "Support bot", "u1", "web",
     [(10, 10, 0.1, "model-small"), (10, 10, 0.1, "model-small"), (10, 10, 0.1, "model-small")], 300),
]
CHATS_B = [("b1", -2, "ag-x", "Bee agent", "v1", "web", [(1000, 500, 3.0, "model-large")], 30)]

WEEK = {"total_chats": 2, "total_messages": 3, "total_tokens": 475}
MONTH = {"total_chats": 3, "total_messages": 6, "total_tokens": 535}


def chat_events(chat) -> list[dict]:
    chat_id, offset, agent_id, agent_name, user, channel, messages, seconds = chat
    common = {"sessionId": f"s-{chat_id}", "userId": user, "eventCategory": "chat"}
    props = {"chatId": chat_id, "agentId": agent_id, "agentName": agent_name, "channel": channel}
    start = dt.datetime.fromisoformat(at(offset, "10:00:00").replace("Z", "+00:00"))
    events = [{**common, "eventType": "chat_started", "eventId": f"{chat_id}-start",
               "timestamp": start.isoformat().replace("+00:00", "Z"), "properties": props}]
    for n, (tokens_in, tokens_out, cost, model) in enumerate(messages):
        moment = start + dt.timedelta(seconds=n + 1)
        events.append({**common, "eventType": "message", "eventId": f"{chat_id}-m{n}",
                       "timestamp": moment.isoformat().replace("+00:00", "Z"),
                       "properties": {**props, "direction": "inbound" if n % 2 == 0 else "outbound",
                                      "model": model, "service": "chat", "inputTokens": tokens_in,
                                      "outputTokens": tokens_out, "cost": cost}})
    end = start + dt.timedelta(seconds=seconds)
    events.append({**common, "eventType": "chat_ended", "eventId": f"{chat_id}-end",
                   "timestamp": end.isoformat().replace("+00:00", "Z"), "properties": props})
    return events


@pytest.fixture(scope="module")
def browser_product(database_url):
    """A product of its own, so the platform-wide numbers are exactly this module's data."""
    from sqlalchemy import create_engine, text

    from migrations.runner import create_product

    chromium_paths()  # skip (or fail under REQUIRE_SERVICES) before doing any work
    engine = create_engine(database_url)
    slug = create_product(engine, f"console_{uuid.uuid4().hex[:8]}")
    yield slug
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "product_{slug}" CASCADE'))
        conn.execute(text("DELETE FROM platform.products WHERE slug = :s"), {"s": slug})
    engine.dispose()


@pytest.fixture()
def console(make_app, browser_product):
    """(app, orgs, requests seen) with the data ingested; `serve()` opens a live server + browser."""

    def build(**config):
        app = make_app(CONSOLE_DEV_SIGNIN=True, REDIS_URL="", **config)
        seen: list[tuple[str, int, str]] = []
        lock = threading.Lock()

        @app.after_request
        def record(response):
            from flask import request

            header = request.headers.get("Authorization", "")
            with lock:
                seen.append((request.path, response.status_code, header.rsplit(" ", 1)[-1]))
            return response

        return app, seen

    return build


@pytest.fixture(scope="module")
def orgs(app, database_url, browser_product):
    """Ingest the chats of org A and org B through the public ingest API, once for the module
    (written inline: no REDIS_URL); returns their ids."""
    from app import create_app
    from app.extensions import celery_app
    from app.tasks import init_celery
    from tests.conftest import app_config

    writer = create_app(app_config(database_url, REDIS_URL=""))
    client = writer.test_client()
    org_a, org_b = f"org-a-{uuid.uuid4().hex[:8]}", f"org-b-{uuid.uuid4().hex[:8]}"
    try:
        for org, chats in ((org_a, CHATS_A), (org_b, CHATS_B)):
            headers = bearer(token(org=org, scopes=("write",), product=browser_product))
            for chat in chats:
                for event in chat_events(chat):
                    resp = client.post("/api/v1/analytics/events", json=event, headers=headers)
                    assert resp.status_code == 202, resp.get_data(as_text=True)
    finally:
        init_celery(celery_app, app)  # Celery is process-global: give it back to the test app
    return org_a, org_b


@pytest.fixture()
def browser():
    driver = chromium_driver()
    yield driver
    driver.quit()


# ------------------------------------------------------------------------- page helpers

def wait(driver, predicate, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(predicate)


def sign_in(driver, base, org, product, role=""):
    from selenium.webdriver.common.by import By

    driver.get(base + "/console/analytics")
    wait(driver, lambda d: d.find_element(By.ID, "signin").is_displayed())
    form = driver.find_element(By.ID, "dev-signin-form")
    form.find_element(By.NAME, "orgId").send_keys(org)
    form.find_element(By.NAME, "product").send_keys(product)
    if role:
        form.find_element(By.CSS_SELECTOR, f"select[name=role] option[value={role}]").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def wait_loaded(driver, view, first, last):
    expected = f"{view}:{first}:{last}"
    wait(driver, lambda d: d.execute_script("return document.body.getAttribute('data-loaded')") == expected
         and d.execute_script("return document.body.classList.contains('loading')") is False)


def totals(driver, container):
    return driver.execute_script(
        "var out = {}; document.querySelectorAll('#' + arguments[0] + ' [data-metric]').forEach("
        "function (el) { out[el.getAttribute('data-metric')] = [el.getAttribute('data-value'), el.textContent]; });"
        "return out;", container)


def chart(driver, canvas_id):
    return driver.execute_script(
        "var c = Chart.getChart(document.getElementById(arguments[0]));"
        "return c ? {labels: c.data.labels, datasets: c.data.datasets.map(function (d) {"
        "  return {label: d.label, data: d.data}; })} : null;", canvas_id)


def table(driver, table_id):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr')).map(function (tr) {"
        "  return [tr.getAttribute('data-id')].concat(Array.from(tr.cells).map(function (td) {"
        "    return td.textContent; })); });", table_id)


def api_data(app, path, org, product, first, last, role=None):
    resp = app.test_client().get(f"/api/v1/analytics/{path}?from={first}&to={last}",
                                 headers=bearer(token(org=org, scopes=("read",), product=product, role=role)))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["data"]


def screenshot(driver, name):
    """Screenshots land in var/test/; CONSOLE_SCREENSHOT_DIR=docs/images refreshes the README's."""
    folder = os.environ.get("CONSOLE_SCREENSHOT_DIR") or os.path.join(ROOT, "var", "test")
    os.makedirs(folder, exist_ok=True)
    driver.save_screenshot(os.path.join(folder, name))


def severe_console_errors(driver):
    # A 401 from /console/token on first load (no session yet) is the page asking, not an error.
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "/console/token" not in e["message"] and "401" not in e["message"]]


# ------------------------------------------------------------------------- tests

def test_org_dashboard_shows_the_api_numbers_and_the_date_picker_changes_them(console, orgs, browser,
                                                                              browser_product):
    from selenium.webdriver.common.by import By

    org_a, _ = orgs
    app, seen = console()
    with live_server(app) as base:
        sign_in(browser, base, org_a, browser_product)
        wait_loaded(browser, "org", day(-29), day(0))  # the default range: last 30 days

        shown = totals(browser, "org-totals")
        summary = api_data(app, "summary", org_a, browser_product, day(-29), day(0))
        for key, value in MONTH.items():
            assert summary[key] == value
            assert float(shown[key][0]) == value
        assert shown["total_chats"][1] == "3" and shown["total_tokens"][1] == "535"
        for key in ("total_cost", "unique_users", "avg_session_duration"):
            assert float(shown[key][0]) == pytest.approx(summary[key])
        assert shown["total_cost"][1] == f"${summary['total_cost']:,.2f}"

        daily = chart(browser, "daily-chart")
        assert daily["labels"] == [day(n) for n in range(-29, 1)]
        chats_by_day = dict(zip(daily["labels"], daily["datasets"][0]["data"], strict=True))
        assert [d["label"] for d in daily["datasets"]] == ["Chats", "Messages", "Tokens"]
        assert {k: v for k, v in chats_by_day.items() if v} == {day(-20): 1, day(-3): 1, day(-1): 1}
        tokens_by_day = dict(zip(daily["labels"], daily["datasets"][2]["data"], strict=True))
        assert (tokens_by_day[day(-1)], tokens_by_day[day(-3)], tokens_by_day[day(-20)]) == (400, 75, 60)
        assert not browser.find_element(By.ID, "daily-empty").is_displayed()

        agents = table(browser, "agents-table")
        assert [(row[0], row[1], row[2], row[3]) for row in agents] == [
            ("ag-support", "Support bot", "2", "5"), ("ag-sales", "Sales helper", "1", "1")]
        usage = {(row[1], row[2]): row for row in table(browser, "usage-table")}
        assert set(usage) == {("chat", "model-large"), ("chat", "model-small")}
        assert usage[("chat", "model-large")][6] == "400"
        usage_chart = chart(browser, "usage-chart")
        assert len(usage_chart["labels"]) == 2
        screenshot(browser, "console-org.png")

        # The sortable agents table: by name ascending, then descending.
        header = browser.find_element(By.CSS_SELECTOR, "#agents-table th[data-key=agent_name] button")
        header.click()
        assert [row[1] for row in table(browser, "agents-table")] == ["Support bot", "Sales helper"]
        header.click()
        assert [row[1] for row in table(browser, "agents-table")] == ["Sales helper", "Support bot"]
        assert browser.find_element(By.CSS_SELECTOR, "#agents-table th[data-key=agent_name]") \
            .get_attribute("aria-sort") == "ascending"

        # Last 7 days: c3 (20 days ago) drops out of every number.
        browser.find_element(By.CSS_SELECTOR, ".range-presets button[data-days='7']").click()
        wait_loaded(browser, "org", day(-6), day(0))
        shown = totals(browser, "org-totals")
        for key, value in WEEK.items():
            assert float(shown[key][0]) == value
        daily = chart(browser, "daily-chart")
        assert daily["labels"] == [day(n) for n in range(-6, 1)]
        assert sum(daily["datasets"][1]["data"]) == 3
        assert [row[2] for row in table(browser, "agents-table")] == ["1", "1"]

        # A custom range holding only the old chat.
        for field, value in (("range-from", day(-20)), ("range-to", day(-20))):
            browser.execute_script("document.getElementById(arguments[0]).value = arguments[1];", field, value)
        browser.find_element(By.ID, "range-apply").click()
        wait_loaded(browser, "org", day(-20), day(-20))
        shown = totals(browser, "org-totals")
        assert (shown["total_chats"][1], shown["total_messages"][1], shown["total_tokens"][1]) == ("1", "3", "60")
        assert chart(browser, "daily-chart")["labels"] == [day(-20)]

        # A range with nothing in it says so in words.
        for field, value in (("range-from", day(-60)), ("range-to", day(-50))):
            browser.execute_script("document.getElementById(arguments[0]).value = arguments[1];", field, value)
        browser.find_element(By.ID, "range-apply").click()
        wait_loaded(browser, "org", day(-60), day(-50))
        assert "No data in this date range" in browser.find_element(By.ID, "status").text
        assert browser.find_element(By.ID, "daily-empty").is_displayed()
        assert browser.find_element(By.ID, "agents-empty").is_displayed()

        # An inverted custom range is refused by the page before any request.
        for field, value in (("range-from", day(-1)), ("range-to", day(-5))):
            browser.execute_script("document.getElementById(arguments[0]).value = arguments[1];", field, value)
        browser.find_element(By.ID, "range-apply").click()
        wait(browser, lambda d: "start date is after the end date" in d.find_element(By.ID, "status").text)

        assert not browser.find_element(By.ID, "global-tab").is_displayed()  # a member sees no platform view
        assert severe_console_errors(browser) == []
    assert all(status < 500 for _path, status, _tok in seen)


def test_platform_view_for_admins_shows_orgs_and_channels(console, orgs, browser, browser_product):
    from selenium.webdriver.common.by import By

    org_a, org_b = orgs
    app, _ = console()
    with live_server(app) as base:
        sign_in(browser, base, "not an id", browser_product, role="admin")  # refused, saying why
        wait(browser, lambda d: d.find_element(By.ID, "signin-error").is_displayed())
        assert "orgId: Use 1-128 letters" in browser.find_element(By.ID, "signin-error").text
        browser.get_log("browser")  # reading the log empties it: that 400 was expected
        sign_in(browser, base, org_a, browser_product, role="admin")
        wait_loaded(browser, "org", day(-29), day(0))
        browser.find_element(By.ID, "global-tab").click()
        wait_loaded(browser, "global", day(-29), day(0))

        shown = totals(browser, "global-totals")
        summary = api_data(app, "global/summary", org_a, browser_product, day(-29), day(0), role="admin")
        assert summary["total_orgs"] == 2 and summary["total_chats"] == 4
        for key in ("total_orgs", "total_chats", "total_messages", "total_tokens", "total_users"):
            assert float(shown[key][0]) == summary[key]
        rows = {row[0]: row for row in table(browser, "orgs-table")}
        assert set(rows) == {org_a, org_b}
        assert (rows[org_a][2], rows[org_a][3], rows[org_a][4]) == ("3", "6", "535")
        assert (rows[org_b][2], rows[org_b][3], rows[org_b][4]) == ("1", "1", "1,500")
        assert [row[0] for row in table(browser, "orgs-table")] == [org_a, org_b]  # most chats first

        channels = {row[0]: row for row in table(browser, "channels-table")}
        assert set(channels) == {"web", "whatsapp"}
        assert (channels["web"][2], channels["web"][3]) == ("2", "3")  # orgs, chats
        bars = chart(browser, "channels-chart")
        assert dict(zip(bars["labels"], bars["datasets"][0]["data"], strict=True)) == {"web": 3, "whatsapp": 1}
        screenshot(browser, "console-global.png")

        # Drill into a channel: its days and its organizations.
        assert not browser.find_element(By.ID, "channel-detail").is_displayed()
        browser.find_element(By.CSS_SELECTOR, "#channels-table tr[data-id=web] button.pick").click()
        wait_loaded(browser, "global", day(-29), day(0) + ":web")
        assert browser.find_element(By.ID, "channel-title").text == "Channel: web"
        per_day = chart(browser, "channel-daily-chart")
        chats_by_day = dict(zip(per_day["labels"], per_day["datasets"][0]["data"], strict=True))
        assert {k: v for k, v in chats_by_day.items() if v} == {day(-20): 1, day(-2): 1, day(-1): 1}
        on_web = {row[0]: row[2] for row in table(browser, "channel-orgs-table")}
        assert on_web == {org_a: "2", org_b: "1"}

        browser.find_element(By.CSS_SELECTOR, ".range-presets button[data-days='7']").click()
        wait_loaded(browser, "global", day(-6), day(0) + ":web")
        assert totals(browser, "global-totals")["total_chats"][1] == "3"
        assert {row[0]: row[2] for row in table(browser, "channel-orgs-table")} == {org_a: "1", org_b: "1"}
        assert severe_console_errors(browser) == []


def test_an_expired_token_is_refreshed_from_the_session_and_the_call_retried(console, orgs, browser,
                                                                              browser_product, monkeypatch):
    import app.console.routes as console_routes

    org_a, _ = orgs
    app, seen = console()
    issued = []
    real_issue = console_routes.issue_token

    def issue(identity, config, now=None):
        # The first token handed out is already an hour old: expired beyond any leeway.
        answer = real_issue(identity, config, now=time.time() - 3600 if not issued else None)
        issued.append(answer["token"])
        return answer

    monkeypatch.setattr(console_routes, "issue_token", issue)
    with live_server(app) as base:
        sign_in(browser, base, org_a, browser_product)
        wait_loaded(browser, "org", day(-29), day(0))
        assert totals(browser, "org-totals")["total_chats"][1] == "3"
    stale, fresh = issued[0], issued[1]
    api_calls = [(path, status, tok) for path, status, tok in seen if path.startswith("/api/v1/")]
    assert (api_calls[0][1], api_calls[0][2]) == (401, stale)  # the expired token was refused…
    assert any(path == "/console/token" and status == 200 for path, status, _ in seen)  # …refreshed…
    assert {tok for _, status, tok in api_calls if status == 200} == {fresh}  # …and every call retried
    assert len(issued) == 2  # the sign-in token and exactly one refresh


def test_a_short_lived_token_is_refreshed_before_it_expires(console, orgs, browser, browser_product):
    from selenium.webdriver.common.by import By

    org_a, _ = orgs
    # A 20 s token is refreshed half-way through (a 15-minute one: 5 minutes before expiry);
    # leeway 0 so that a token used past its life would really be refused.
    app, seen = console(CONSOLE_TOKEN_TTL_SECONDS=20, JWT_LEEWAY_SECONDS=0)
    with live_server(app) as base:
        sign_in(browser, base, org_a, browser_product)
        wait_loaded(browser, "org", day(-29), day(0))
        first_token = next(tok for path, _s, tok in seen if path.startswith("/api/v1/"))
        wait(browser, lambda _d: any(p == "/console/token" and s == 200 for p, s, _t in seen), timeout=60)
        refreshed_at = next(i for i, (p, s, _t) in enumerate(seen) if p == "/console/token" and s == 200)
        browser.find_element(By.CSS_SELECTOR, ".range-presets button[data-days='7']").click()
        wait_loaded(browser, "org", day(-6), day(0))
    # the refresh came from the timer, not from a refused call
    assert all(status != 401 for path, status, _ in seen[:refreshed_at] if path.startswith("/api/v1/"))
    later = [(status, tok) for path, status, tok in seen[refreshed_at:] if path.startswith("/api/v1/analytics")]
    assert len(later) == 4
    assert all(status == 200 and tok != first_token for status, tok in later)


def test_pasted_tokens_and_the_messages_people_see(make_app, orgs, browser, browser_product):
    """Without the development sign-in the page takes a pasted token (e.g. `flask token mint`), and
    says in words what is wrong with one that cannot be used."""
    from selenium.webdriver.common.by import By

    org_a, _ = orgs
    app = make_app()  # CONSOLE_DEV_SIGNIN off

    def paste(value):
        form = browser.find_element(By.ID, "token-form")
        form.find_element(By.NAME, "token").send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    with live_server(app) as base:
        browser.get(base + "/console/analytics")
        wait(browser, lambda d: d.find_element(By.ID, "signin").is_displayed())
        assert browser.find_elements(By.ID, "dev-signin-form") == []

        paste(token(org=org_a, scopes=("read",), product=browser_product, ttl=-120))  # expired
        wait(browser, lambda d: d.find_element(By.ID, "signin-error").is_displayed())
        assert "access token has expired or is not valid" in browser.find_element(By.ID, "signin-error").text
        assert browser.find_element(By.NAME, "token").get_attribute("value") == ""  # not left in the form

        paste(token(org=org_a, scopes=("write:agents",), product=browser_product))  # no analytics scope
        wait(browser, lambda d: "may not read analytics" in d.find_element(By.ID, "status").text)
        assert "read or read:analytics" in browser.find_element(By.ID, "status").text

        browser.find_element(By.ID, "sign-out").click()
        paste(token(org=org_a, scopes=("read:analytics",), product=browser_product))
        wait_loaded(browser, "org", day(-29), day(0))
        assert totals(browser, "org-totals")["total_chats"][1] == "3"
        assert browser.find_element(By.ID, "status").text == ""
        # nothing of the token is kept where another page or a later visit could read it
        assert browser.execute_script("return window.localStorage.length + window.sessionStorage.length") == 0
        assert browser.execute_script("return document.cookie") == ""


def test_swagger_ui_renders_from_local_assets_under_the_csp(make_app, browser):
    """/api/v1/docs draws every operation with only this origin's files; a CSP violation or a
    failed load would show up as a SEVERE console message."""
    from selenium.webdriver.common.by import By

    with live_server(make_app()) as base:
        browser.get(base + "/api/v1/docs")
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 0)
        paths = browser.execute_script(
            "return Array.from(document.querySelectorAll('.opblock-summary-path')).map(function (e) {"
            "  return e.getAttribute('data-path'); });")
        assert "/api/v1/analytics/summary" in paths and "/api/v1/me" in paths
        loaded = browser.execute_script(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; });")
        assert loaded and all(url.startswith(base + "/") for url in loaded), loaded
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_page_shows_that_it_is_loading_until_the_answers_arrive(console, orgs, browser, browser_product):
    from selenium.webdriver.common.by import By

    org_a, _ = orgs
    app, _seen = console()
    gate = threading.Event()
    gate.set()

    @app.before_request
    def hold_analytics():  # the test decides when the analytics answers may leave
        from flask import request

        if request.path.startswith("/api/v1/analytics/"):
            gate.wait(30)

    with live_server(app) as base:
        sign_in(browser, base, org_a, browser_product)
        wait_loaded(browser, "org", day(-29), day(0))
        gate.clear()
        browser.find_element(By.CSS_SELECTOR, ".range-presets button[data-days='90']").click()
        wait(browser, lambda d: d.find_element(By.ID, "status").text == "Loading analytics…")
        assert browser.find_element(By.ID, "org-view").get_attribute("aria-busy") == "true"
        assert browser.execute_script("return document.body.getAttribute('data-loaded')") is None
        gate.set()
        wait_loaded(browser, "org", day(-89), day(0))
        assert browser.find_element(By.ID, "status").text == ""
        assert browser.find_element(By.ID, "org-view").get_attribute("aria-busy") == "false"
