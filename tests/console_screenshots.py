"""Refresh the console screenshots of the README (docs/images/console-*.png): the organization view,
the platform view drilled into a channel, and the organization view 390 px wide.

    .venv/bin/python -m tests.console_screenshots

Runs the app on a free loopback port against the test database, in a throw-away product filled by
`flask analytics demo`'s generator (three orgs, 90 days), and photographs the organization and the
platform view in headless Chromium. Needs chromium + chromium-driver (see .ci/run).
"""

from __future__ import annotations

import os
import time

from sqlalchemy import create_engine, text

from tests.browser_support import chromium_driver, live_server
from tests.conftest import ROOT, _database_url, app_config

OUT = os.path.join(ROOT, "docs", "images")
ORGS = (("acme", 420), ("globex", 180), ("initech", 70))
PRODUCT = "demo"  # a product of the test database, made and dropped by this script


def _fill(app, product: str) -> None:
    from app.analytics.demo import demo_events, ingest_bodies

    with app.app_context():
        for n, (org, chats) in enumerate(ORGS):
            ingest_bodies(demo_events(org, 90, chats, seed=n + 1), org, product)


def _settle(driver, key: str) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if driver.execute_script("return document.body.getAttribute('data-loaded')") == key:
            time.sleep(0.3)
            return
        time.sleep(0.1)
    raise RuntimeError(f"the console did not finish loading {key}")


def _shoot(driver, name: str, width: int = 1400) -> None:
    height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
    # the window's height includes what is not page; grow until the page fits the viewport
    for _ in range(5):
        inner = driver.execute_script("return window.innerHeight")
        if inner >= height:
            break
        driver.set_window_size(width, driver.get_window_size()["height"] + height - inner)
    time.sleep(0.5)
    driver.save_screenshot(os.path.join(OUT, name))
    print("wrote", os.path.join(OUT, name))


def main() -> None:
    from selenium.webdriver.common.by import By

    from app import create_app
    from migrations.runner import create_product, upgrade_all

    url = _database_url()
    engine = create_engine(url)
    upgrade_all(engine, "default")
    _drop(engine, PRODUCT)  # left over from an interrupted run
    product = create_product(engine, PRODUCT)
    try:
        app = create_app(app_config(url, CONSOLE_DEV_SIGNIN=True, REDIS_URL=""))
        _fill(app, product)
        os.makedirs(OUT, exist_ok=True)
        with live_server(app) as base:
            driver = chromium_driver(1400, 1000)
            try:
                driver.get(base + "/console/analytics")
                form = driver.find_element(By.ID, "dev-signin-form")
                form.find_element(By.NAME, "orgId").send_keys("acme")
                form.find_element(By.NAME, "product").send_keys(product)
                form.find_element(By.CSS_SELECTOR, "select[name=role] option[value=admin]").click()
                form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
                first, last = driver.execute_script(
                    "var t = new Date().toISOString().slice(0, 10); var d = new Date(t + 'T00:00:00Z');"
                    "d.setUTCDate(d.getUTCDate() - 29); return [d.toISOString().slice(0, 10), t];")
                _settle(driver, f"org:{first}:{last}")
                _shoot(driver, "console-org.png")
                driver.set_window_size(1400, 1000)
                driver.find_element(By.ID, "global-tab").click()
                _settle(driver, f"global:{first}:{last}")
                driver.find_element(By.CSS_SELECTOR, "#channels-table tr[data-id=web] button.pick").click()
                _settle(driver, f"global:{first}:{last};channel=web")
                _shoot(driver, "console-global.png")
                driver.find_element(By.CSS_SELECTOR, ".tab[data-view=org]").click()
                _settle(driver, f"org:{first}:{last}")
                driver.set_window_size(390, 900)
                time.sleep(0.5)
                _shoot(driver, "console-mobile.png", width=390)
            finally:
                driver.quit()
    finally:
        _drop(engine, product)
        engine.dispose()


def _drop(engine, product: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "product_{product}" CASCADE'))
        conn.execute(text("DELETE FROM platform.products WHERE slug = :s"), {"s": product})


if __name__ == "__main__":
    main()
