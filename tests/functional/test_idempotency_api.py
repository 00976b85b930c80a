"""Idempotency keys through HTTP (app.idempotency): a retried POST with the same `Idempotency-Key` runs once.

Against the real PostgreSQL; the image upstream is a fake on loopback (tests/images_fakes.py) that can
hold its answer until the test lets it go, so "the first request is still running" is a state the test
reaches by waiting for the upstream to have the call, never by sleeping. One test runs a second API
process (gunicorn) on the same database; one kills that process mid-request.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, update

from app.db import db
from app.entities.models import EntityRecord
from app.idempotency import keys
from app.images.models import ImageUsage
from app.registry import registry_of
from app.tasks import run_maintenance
from tests.functional.entities_support import create_definition
from tests.functional.test_reliability import start_gunicorn
from tests.images_fakes import FakeAzureImages, Reply
from tests.support import assert_error

IMAGES = "/api/v1/agents/images"
IMAGE = {"provider": "provider-a", "model": "gpt-image-1", "prompt": "a red fox in snow"}
# the bytes every client of a cross-process test sends (a retry resends the same bytes: the fingerprint
# is the raw body, and `requests` and Flask's test client serialise JSON with other separators)
IMAGE_BYTES = json.dumps(IMAGE).encode()
JSON = {"Content-Type": "application/json"}
RECORDS = "/api/v1/entities/{}/records"
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "qty": {"type": "int"}}}


class GatedImages(FakeAzureImages):
    """provider-a that, while `gate` is closed, holds every answer until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def _next_reply(self, request):
        self.gate.wait(60)
        return super()._next_reply(request)

    def wait_for_calls(self, count: int, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while len(self.received) < count:
            assert time.time() < deadline, f"the upstream saw {len(self.received)} calls, expected {count}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def upstream():
    fake = GatedImages()
    yield fake
    fake.gate.set()
    fake.close()


def provider_settings(fake) -> dict[str, str]:
    return {"PROVIDER_A_ENDPOINT": fake.url, "PROVIDER_A_API_KEY": FakeAzureImages.API_KEY,
            "PROVIDER_A_API_VERSION": FakeAzureImages.GENERATION_VERSION,
            "PROVIDER_A_EDIT_API_VERSION": FakeAzureImages.EDIT_VERSION}


@pytest.fixture()
def images(app, upstream):
    """The session app pointed at the gated fake (restored afterwards)."""
    settings = provider_settings(upstream)
    saved = {k: app.config.get(k) for k in settings}
    app.config.update(settings)
    registry_of(app).drop("image_provider")
    upstream.reset()
    upstream.gate.set()
    yield upstream
    upstream.gate.set()
    assert upstream.violations == []
    app.config.update(saved)
    registry_of(app).drop("image_provider")


def keyed(headers: dict, key: str | None = None, **more) -> dict:
    return {**headers, "Idempotency-Key": key or str(uuid.uuid4()), **more}


def usage_lines(app, org_id) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(ImageUsage).where(ImageUsage.org_id == org_id))


def record_count(app, org_id) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(EntityRecord).where(EntityRecord.org_id == org_id))


def key_rows(app, org_id) -> list:
    with app.app_context():
        return db.session.execute(select(keys).where(keys.c.org_id == org_id)).all()


@pytest.fixture()
def writer(client, auth):
    headers = auth("read", "write")
    create_definition(client, headers, "items", SCHEMA)
    return headers


# -- replay -----------------------------------------------------------------------------------------

def test_a_retried_record_create_is_replayed_not_repeated(app, client, writer, org_id):
    headers = keyed(writer)
    first = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    again = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.data == first.data and again.headers["Content-Type"] == first.headers["Content-Type"]
    assert again.headers["X-Request-ID"] != first.headers["X-Request-ID"]  # per request, not replayed
    assert record_count(app, org_id) == 1
    # without a key, nothing changes: each POST creates
    client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=writer)
    client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=writer)
    assert record_count(app, org_id) == 3
    (row,) = key_rows(app, org_id)  # requests without the header leave no key
    assert row.state == "done" and row.response_status == 201
    assert row.route == "/api/v1/entities/<string:entityName>/records" and row.subject == "user:user-1"


def test_the_same_key_for_another_request_is_422(app, client, writer, org_id):
    headers = keyed(writer)
    assert client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers).status_code == 201
    error = assert_error(client.post(RECORDS.format("items"), json={"fields": {"title": "b"}}, headers=headers),
                         422, "IDEMPOTENCY_KEY_REUSED")["error"]
    assert error["details"] == {"header": "Idempotency-Key"}
    # the same bytes with other whitespace are another request (the fingerprint is the raw body)
    spaced = client.post(RECORDS.format("items"), data='{"fields": {"title": "a"} }', headers=headers,
                         content_type="application/json")
    assert_error(spaced, 422, "IDEMPOTENCY_KEY_REUSED")
    # another path under the same route template is another request too
    create_definition(client, writer, "others", SCHEMA)
    assert_error(client.post(RECORDS.format("others"), json={"fields": {"title": "a"}}, headers=headers),
                 422, "IDEMPOTENCY_KEY_REUSED")
    assert record_count(app, org_id) == 1


def test_keys_are_scoped_to_the_caller_and_the_operation(app, client, writer, auth, make_token, org_id):
    key = str(uuid.uuid4())
    body = {"fields": {"title": "a"}}
    assert client.post(RECORDS.format("items"), json=body, headers=keyed(writer, key)).status_code == 201
    # another user of the org: its own key space, so this runs
    other_user = client.post(RECORDS.format("items"), json=body,
                             headers=keyed(auth("read", "write", user="user-2"), key))
    assert other_user.status_code == 201 and "Idempotent-Replayed" not in other_user.headers
    # another operation: a definition create with the same key runs
    made = client.post("/api/v1/entities/definitions", json={"name": "third", "displayName": "Third", "schema": SCHEMA},
                       headers=keyed(writer, key))
    assert made.status_code == 201 and "Idempotent-Replayed" not in made.headers
    assert record_count(app, org_id) == 2
    # another org: nothing is shared (and its definition does not exist there: 404, stored for that org)
    stranger = f"org-{uuid.uuid4().hex[:12]}"
    foreign = client.post(RECORDS.format("items"), json=body,
                          headers={"Authorization": f"Bearer {make_token(org=stranger)}", "Idempotency-Key": key})
    assert_error(foreign, 404, "NOT_FOUND")


def test_a_refusal_is_stored_and_replayed(app, client, writer, org_id):
    headers = keyed(writer)
    bad = client.post(RECORDS.format("items"), json={"fields": {"qty": "many"}}, headers=headers)
    assert_error(bad, 400, "VALIDATION_ERROR")
    again = client.post(RECORDS.format("items"), json={"fields": {"qty": "many"}}, headers=headers)
    assert again.status_code == 400 and again.headers["Idempotent-Replayed"] == "true" and again.data == bad.data
    assert record_count(app, org_id) == 0


def test_a_failed_upstream_call_releases_the_key_so_the_retry_runs(app, client, auth, images, org_id):
    headers = keyed(auth("write:image-gen"))
    busy = Reply(503, {"error": {"code": "ServiceUnavailable", "message": "busy"}})
    images.reply(busy, busy)  # the provider retries a 503 once
    assert_error(client.post(IMAGES, json=IMAGE, headers=headers), 503, "SERVICE_UNAVAILABLE")
    assert key_rows(app, org_id) == []
    retried = client.post(IMAGES, json=IMAGE, headers=headers)
    assert retried.status_code == 200 and "Idempotent-Replayed" not in retried.headers
    replayed = client.post(IMAGES, json=IMAGE, headers=headers)
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.get_json()["data"]["url"] == retried.get_json()["data"]["url"]
    assert len(images.received) == 3  # the failed call (tried twice) and the retry; the replay called nobody


@pytest.mark.parametrize("value", ["", "   ", "x" * 256, "caf\u00e9", '"a b"'])
def test_a_malformed_key_is_400(client, writer, value):
    resp = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}},
                       headers={**writer, "Idempotency-Key": value})
    assert assert_error(resp, 400, "INVALID_INPUT")["error"]["details"] == {"header": "Idempotency-Key"}


def test_a_quoted_key_names_the_same_key_as_the_bare_one(client, writer):
    first = client.post(RECORDS.format("items"), json={"fields": {"title": "q"}}, headers=keyed(writer, '"k-1"'))
    again = client.post(RECORDS.format("items"), json={"fields": {"title": "q"}}, headers=keyed(writer, "k-1"))
    assert first.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"


# -- concurrency --------------------------------------------------------------------------------------

def test_a_duplicate_while_the_image_call_runs_is_409_then_replayed(app, client, auth, images, org_id):
    headers = keyed(auth("write:image-gen"))
    images.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(lambda: app.test_client().post(IMAGES, json=IMAGE, headers=headers))
        images.wait_for_calls(1)
        busy = client.post(IMAGES, json=IMAGE, headers=headers)
        error = assert_error(busy, 409, "IDEMPOTENCY_KEY_IN_USE")["error"]
        assert busy.headers["Retry-After"] == str(error["details"]["retryAfterSeconds"])
        # another body with the key is refused as such, running or not
        assert_error(client.post(IMAGES, json=IMAGE | {"prompt": "a cat"}, headers=headers), 422,
                     "IDEMPOTENCY_KEY_REUSED")
        images.gate.set()
        original = first.result(60)
    assert original.status_code == 200
    replayed = client.post(IMAGES, json=IMAGE, headers=headers)
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.data == original.data
    assert len(images.received) == 1 and usage_lines(app, org_id) == 1  # one upstream call, one image


def test_concurrent_duplicates_create_one_record(app, writer, org_id):
    headers = keyed(writer)
    start = threading.Barrier(8)

    def post(_):
        start.wait(30)
        return app.test_client().post(RECORDS.format("items"), json={"fields": {"title": "race"}}, headers=headers)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    ran = [a for a in answers if a.status_code == 201 and "Idempotent-Replayed" not in a.headers]
    replayed = [a for a in answers if a.headers.get("Idempotent-Replayed") == "true"]
    busy = [a for a in answers if a.status_code == 409]
    assert len(ran) == 1 and len(ran) + len(replayed) + len(busy) == 8, [a.status_code for a in answers]
    assert all(a.get_json()["error"]["code"] == "IDEMPOTENCY_KEY_IN_USE" for a in busy)
    assert all(a.data == ran[0].data for a in replayed)
    assert record_count(app, org_id) == 1


def test_two_api_processes_share_the_key(app, client, auth, images, database_url, org_id):
    """A gunicorn process and the test app on one database: a duplicate reaching the other process
    while the first runs is 409, and after it the other process replays the answer."""
    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4", **provider_settings(images))
    try:
        headers = keyed(auth("write:image-gen"))
        images.gate.clear()
        import requests

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(requests.post, f"http://127.0.0.1:{port}{IMAGES}", data=IMAGE_BYTES,
                                headers=headers | JSON, timeout=60)
            images.wait_for_calls(1)
            assert_error(client.post(IMAGES, data=IMAGE_BYTES, headers=headers | JSON), 409, "IDEMPOTENCY_KEY_IN_USE")
            images.gate.set()
            original = first.result(60)
        assert original.status_code == 200, original.text
        here = client.post(IMAGES, data=IMAGE_BYTES, headers=headers | JSON)
        assert here.status_code == 200 and here.headers["Idempotent-Replayed"] == "true"
        assert here.data == original.content
        there = requests.post(f"http://127.0.0.1:{port}{IMAGES}", data=IMAGE_BYTES, headers=headers | JSON,
                              timeout=60)
        assert there.status_code == 200 and there.headers["Idempotent-Replayed"] == "true"
        assert len(images.received) == 1 and usage_lines(app, org_id) == 1
    finally:
        images.gate.set()
        proc.terminate()
        proc.wait(30)


def test_a_process_killed_mid_request_leaves_a_lock_that_expires(app, client, auth, images, database_url, org_id):
    """The process holding the key dies (SIGKILL) during the upstream call: duplicates get 409 until
    IDEMPOTENCY_LOCK_SECONDS have passed, then a retry runs and answers."""
    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4", IDEMPOTENCY_LOCK_SECONDS="2",
                                **provider_settings(images))
    import requests

    headers = keyed(auth("write:image-gen"))
    try:
        images.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            doomed = pool.submit(requests.post, f"http://127.0.0.1:{port}{IMAGES}", data=IMAGE_BYTES,
                                 headers=headers | JSON, timeout=60)
            images.wait_for_calls(1)
            _kill_tree(proc.pid)
            with pytest.raises(requests.RequestException):
                doomed.result(60)
    finally:
        images.gate.set()
        _kill_tree(proc.pid)
        proc.wait(30)
    (row,) = key_rows(app, org_id)
    assert row.state == "running"
    deadline = time.time() + 60
    while True:
        answer = client.post(IMAGES, data=IMAGE_BYTES, headers=headers | JSON)
        if answer.status_code != 409:
            break
        assert time.time() < deadline, "the dead process's claim never expired"
        time.sleep(0.2)
    assert answer.status_code == 200 and "Idempotent-Replayed" not in answer.headers
    assert len(images.received) == 2  # the killed call, and the retry that ran
    assert client.post(IMAGES, data=IMAGE_BYTES, headers=headers | JSON).headers["Idempotent-Replayed"] == "true"


def _kill_tree(pid: int) -> None:
    """SIGKILL gunicorn's master and its workers (children of `pid`)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for child in parent.children(recursive=True):
        child.kill()
    parent.kill()


# -- the size bound of a stored answer (IDEMPOTENCY_MAX_ANSWER_BYTES) -----------------------------------

@pytest.fixture()
def answer_bound(app):
    """Sets IDEMPOTENCY_MAX_ANSWER_BYTES for one test (restored afterwards)."""
    saved = app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"]

    def bound(value: int) -> None:
        app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"] = value

    yield bound
    app.config["IDEMPOTENCY_MAX_ANSWER_BYTES"] = saved


BULK = {"records": [{"fields": {"title": "a"}}, {"fields": {"title": "b"}}]}


def test_an_answer_at_the_bound_is_stored_and_replayed_whole(app, client, writer, org_id, answer_bound):
    probe = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=writer)
    assert probe.status_code in (200, 201), probe.get_json()
    answer_bound(len(probe.data))  # the answer is exactly as large as the bound
    headers = keyed(writer)
    first = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    again = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true" and again.status_code == first.status_code
    assert again.data == first.data
    (row,) = key_rows(app, org_id)
    assert bytes(row.response_body) == first.data and row.response_bytes == len(first.data)
    assert row.response_sha256 is None
    assert record_count(app, org_id) == 4


def test_an_answer_above_the_bound_is_not_stored_and_its_replay_says_it_ran(app, client, writer, org_id,
                                                                            answer_bound):
    probe = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=writer)
    answer_bound(len(probe.data) - 1)  # one byte over
    headers = keyed(writer)
    first = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    assert first.status_code == probe.status_code and first.get_json() == probe.get_json()  # the caller sees it
    again = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    error = assert_error(again, 409, "IDEMPOTENCY_ANSWER_NOT_STORED")["error"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert error["details"]["originalStatus"] == first.status_code
    assert error["details"]["answerBytes"] == len(first.data)
    assert error["details"]["answerSha256"] == hashlib.sha256(first.data).hexdigest()
    assert error["details"]["maxAnswerBytes"] == len(first.data) - 1
    assert record_count(app, org_id) == 4  # the probe's two and the keyed request's two: it never ran again
    (row,) = key_rows(app, org_id)
    assert row.response_body is None and row.state == "done" and row.response_bytes == len(first.data)


def test_an_async_job_above_the_bound_replays_its_location(app, client, writer, org_id, answer_bound):
    answer_bound(16)
    headers = keyed(writer, Prefer="respond-async")
    first = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    assert first.status_code == 202 and len(first.data) > 16
    again = client.post(RECORDS.format("items") + "/bulk/create", json=BULK, headers=headers)
    error = assert_error(again, 409, "IDEMPOTENCY_ANSWER_NOT_STORED")["error"]
    assert error["details"]["originalStatus"] == 202
    assert again.headers["Location"] == first.headers["Location"] == error["details"]["location"]
    assert client.get(first.headers["Location"], headers=writer).status_code == 200  # where to look it up


def test_a_created_record_above_the_bound_replays_its_etag(app, client, writer, org_id, answer_bound):
    answer_bound(16)
    headers = keyed(writer)
    first = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers)
    assert first.status_code == 201
    again = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers)
    error = assert_error(again, 409, "IDEMPOTENCY_ANSWER_NOT_STORED")["error"]
    assert error["details"]["originalStatus"] == 201
    assert again.headers["ETag"] == first.headers["ETag"]
    # the client looks the record up instead
    record_id = first.get_json()["id"]
    assert client.get(RECORDS.format("items") + f"/{record_id}", headers=writer).status_code == 200
    assert record_count(app, org_id) == 1


def test_a_refusal_above_the_bound_releases_the_key(app, client, writer, org_id, answer_bound):
    answer_bound(16)
    headers = keyed(writer)
    bad = {"records": [{"fields": {"title": 1}}] * 3}
    first = client.post(RECORDS.format("items") + "/bulk/create", json=bad, headers=headers)
    assert 400 <= first.status_code < 500 and len(first.data) > 16
    assert key_rows(app, org_id) == []  # nothing happened, nothing kept: the retry runs (and is refused again)
    again = client.post(RECORDS.format("items") + "/bulk/create", json=bad, headers=headers)
    assert again.status_code == first.status_code and "Idempotent-Replayed" not in again.headers
    assert record_count(app, org_id) == 0


# -- async jobs, email, seeding ----------------------------------------------------------------------

def test_an_async_bulk_job_is_replayed_with_the_same_job(app, client, writer, org_id):
    headers = keyed(writer, Prefer="respond-async")
    body = {"records": [{"fields": {"title": "a"}}, {"fields": {"title": "b"}}]}
    first = client.post(RECORDS.format("items") + "/bulk/create", json=body, headers=headers)
    assert first.status_code == 202, first.get_json()
    job = first.get_json()["jobId"]
    again = client.post(RECORDS.format("items") + "/bulk/create", json=body, headers=headers)
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["jobId"] == job and again.headers["Location"] == f"/api/v1/jobs/{job}"
    assert again.headers["Preference-Applied"] == "respond-async"
    from app.entities.models import BulkJob

    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(BulkJob).where(BulkJob.org_id == org_id)) == 1


def test_a_retried_email_send_sends_once(app, client, auth, org_id):
    outbox = os.path.join(app.config["VAR_DIR"], "outbox")
    subject = f"Once {uuid.uuid4().hex[:8]}"
    headers = keyed(auth("write:notifications"))
    body = {"to": ["ann@example.com"], "subject": subject, "body": "<p>Hello</p>"}
    first = client.post("/api/v1/email/send", json=body, headers=headers)
    again = client.post("/api/v1/email/send", json=body, headers=headers)
    assert first.status_code == again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    sent = [p for p in glob.glob(os.path.join(outbox, "*.eml")) if subject.encode() in open(p, "rb").read()]
    assert len(sent) == 1


# -- expiry -------------------------------------------------------------------------------------------

def test_expired_keys_are_deleted_by_the_maintenance_loop_and_run_again(app, client, writer, org_id):
    headers = keyed(writer)
    assert client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers).status_code == 201
    with app.app_context():
        # the row's lifetime is over (IDEMPOTENCY_TTL_SECONDS after the first request)
        db.session.execute(update(keys).where(keys.c.org_id == org_id).values(expires_at=func.now()))
        db.session.commit()
    # an expired key is a new key even before the cleanup ran
    rerun = client.post(RECORDS.format("items"), json={"fields": {"title": "a"}}, headers=headers)
    assert rerun.status_code == 201 and "Idempotent-Replayed" not in rerun.headers
    assert record_count(app, org_id) == 2
    # A worker started by an earlier test runs the same maintenance loop on this database every second and
    # may delete the expired rows between the commit and our round: then our round found nothing, and the
    # round is tried again with a new key (a round that never deletes anything still fails).
    for attempt in range(5):
        if attempt:
            again = client.post(RECORDS.format("items"), json={"fields": {"title": "b"}}, headers=keyed(writer))
            assert again.status_code == 201
        with app.app_context():
            db.session.execute(update(keys).where(keys.c.org_id == org_id).values(expires_at=func.now()))
            db.session.commit()
            outcome = run_maintenance()
        assert key_rows(app, org_id) == []
        if outcome["expired_keys"] >= 1:
            break
    assert outcome["expired_keys"] >= 1


# -- documentation ------------------------------------------------------------------------------------

def test_the_openapi_document_states_the_header_and_its_answers(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    for path in ("/api/v1/agents/images", "/api/v1/entities/{entityName}/records", "/api/v1/email/send",
                 "/api/v1/entities/{entityName}/records/bulk/create", "/api/v1/newsletter/issues",
                 "/api/v1/agents", "/internal/seed"):
        operation = spec["paths"][path]["post"]
        assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in operation["parameters"]), path
        assert {"409", "422"} <= set(operation["responses"]), path
        ok = next(code for code in operation["responses"] if code.startswith("2"))
        assert "Idempotent-Replayed" in operation["responses"][ok]["headers"], path
    query = spec["paths"]["/api/v1/entities/{entityName}/records/query"]["post"]
    assert not any(p["name"] == "Idempotency-Key" for p in query.get("parameters", []))
