"""Bulk send and newsletters through HTTP, with real SMTP conversations (aiosmtpd): refused
recipients, transient 4xx, a server that drops the connection mid-batch, redelivery of a job."""

from __future__ import annotations

import email
import re
import threading
import uuid
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest
from aiosmtpd.controller import Controller

from tests.functional.test_email_api import _free_port

BULK = "/api/v1/email/bulk-send"
NEWS = "/api/v1/newsletter"


class SinkHandler:
    """Accepts everything except `refuse*` (550) and, once per address, `busy*` (451)."""

    def __init__(self, drop_after: int | None = None):
        self.messages: list[tuple[list[str], bytes]] = []
        self.busy_seen: set[str] = set()
        self.drop_after = drop_after
        self.dropped = False
        self.lock = threading.Lock()

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        with self.lock:
            if self.drop_after is not None and not self.dropped and len(self.messages) >= self.drop_after:
                self.dropped = True
                server.transport.close()  # the connection drops in the middle of the batch
                return "421 going away"
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refuse"):
            return "550 5.1.1 mailbox unavailable"
        if address.startswith("busy"):
            with self.lock:
                if address not in self.busy_seen:
                    self.busy_seen.add(address)
                    return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            self.messages.append((list(envelope.rcpt_tos), envelope.content))
        return "250 Message accepted"


def _server(handler):
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    return controller


@pytest.fixture()
def sink():
    handler = SinkHandler()
    controller = _server(handler)
    yield handler, controller.port
    controller.stop()


@pytest.fixture()
def mail_app(make_app):
    """An app sending over SMTP to `port`, running tasks inline (no Redis)."""

    def factory(port, **extra):
        config = {"REDIS_URL": "", "EMAIL_BACKEND": "smtp", "SMTP_HOST": "127.0.0.1", "SMTP_PORT": port,
                  "SMTP_STARTTLS": False, "EMAIL_FROM": "News <news@example.com>",
                  "EMAIL_BULK_RETRY_SECONDS": 0.01, "EMAIL_BULK_CONCURRENCY": 3}
        return make_app(**{**config, **extra})

    return factory


def _recipients(client, job_id, headers, **query):
    out, after = [], None
    while True:
        params = {**query, "limit": 1000, **({"after": after} if after is not None else {})}
        page = client.get(f"{BULK}/{job_id}/recipients", query_string=params, headers=headers).get_json()
        out += page["recipients"]
        if page["nextCursor"] is None:
            return out
        after = page["nextCursor"]


def test_one_message_to_many_recipients(mail_app, sink, auth):
    handler, port = sink
    client = mail_app(port).test_client()
    headers = auth("write:notifications")
    rcpts = [f"user{i}@example.com" for i in range(25)] + ["USER0@example.com", "refuse1@example.com",
                                                           "busy1@example.com"]
    resp = client.post(BULK, json={"recipients": rcpts, "subject": "Hello", "body": "<p>Hi</p>"}, headers=headers)
    assert resp.status_code == 202, resp.get_json()
    accepted = resp.get_json()
    assert accepted["total"] == 27 and resp.headers["Location"] == accepted["statusUrl"]
    job = client.get(accepted["statusUrl"], headers=headers).get_json()["job"]
    assert job["status"] == "done" and job["counts"] == {"pending": 0, "sending": 0, "sent": 26, "failed": 1}
    rows = {r["to"]: r for r in _recipients(client, accepted["jobId"], headers)}
    assert rows["refuse1@example.com"]["status"] == "failed" and rows["refuse1@example.com"]["smtpCode"] == 550
    assert rows["busy1@example.com"]["status"] == "sent" and rows["busy1@example.com"]["attempts"] == 2
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert len(delivered) == 26 and set(delivered.values()) == {1}  # each once, one recipient per message
    msg = email.message_from_bytes(handler.messages[0][1])
    assert msg["Subject"] == "Hello" and "," not in msg["To"]
    failed = _recipients(client, accepted["jobId"], headers, status="failed")
    assert [r["to"] for r in failed] == ["refuse1@example.com"]


def test_many_messages(mail_app, sink, auth):
    handler, port = sink
    client = mail_app(port).test_client()
    headers = auth("write:notifications")
    messages = [{"to": f"m{i}@example.com", "subject": f"Subject {i}", "body": f"Body {i}"} for i in range(10)]
    resp = client.post(BULK, json={"messages": messages}, headers=headers)
    assert resp.status_code == 202
    job = client.get(resp.get_json()["statusUrl"], headers=headers).get_json()["job"]
    assert job["counts"]["sent"] == 10
    subjects = {email.message_from_bytes(c)["To"]: email.message_from_bytes(c)["Subject"] for _, c in handler.messages}
    assert subjects["m3@example.com"] == "Subject 3"


def test_server_dropping_mid_batch_is_retried_without_duplicates(mail_app, auth):
    handler = SinkHandler(drop_after=7)
    controller = _server(handler)
    try:
        client = mail_app(controller.port, EMAIL_BULK_CONCURRENCY=1).test_client()
        headers = auth("write:notifications")
        rcpts = [f"d{i}@example.com" for i in range(20)]
        resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
        job = client.get(resp.get_json()["statusUrl"], headers=headers).get_json()["job"]
    finally:
        controller.stop()
    assert handler.dropped
    assert job["counts"]["sent"] == 20
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert set(delivered) == set(rcpts) and set(delivered.values()) == {1}
    retried = [r for r in _recipients(client, resp.get_json()["jobId"], headers) if r["attempts"] > 1]
    assert len(retried) == 1


def test_server_gone_for_good_fails_after_max_attempts(mail_app, auth):
    client = mail_app(_free_port(), EMAIL_BULK_MAX_ATTEMPTS=2).test_client()
    headers = auth("write:notifications")
    resp = client.post(BULK, json={"recipients": ["a@example.com", "b@example.com"], "subject": "s", "body": "b"},
                       headers=headers)
    job_id = resp.get_json()["jobId"]
    rows = _recipients(client, job_id, headers)
    assert all(r["status"] == "failed" and r["attempts"] == 2 and "connection" in r["error"] for r in rows)


def test_redelivered_job_sends_nothing_twice(mail_app, sink, auth, org_id):
    """A task delivered again (worker lost): sent rows are skipped, rows caught mid-send are not resent."""
    handler, port = sink
    app = mail_app(port)
    client = app.test_client()
    headers = auth("write:notifications")
    resp = client.post(BULK, json={"recipients": [f"r{i}@example.com" for i in range(6)], "subject": "s",
                                   "body": "b"}, headers=headers)
    job_id = resp.get_json()["jobId"]
    assert len(handler.messages) == 6
    from sqlalchemy import update

    from app.db import db
    from app.email.bulk import run_job
    from app.email.models import EmailDelivery, EmailJob

    with app.app_context():  # simulate: the worker died while rows 4-5 were being sent, before it recorded them
        db.session.execute(update(EmailDelivery).where(EmailDelivery.job_id == job_id, EmailDelivery.seq >= 4)
                           .values(status="sending"))
        db.session.execute(update(EmailJob).where(EmailJob.id == job_id).values(status="sending"))
        db.session.commit()
        product = app.config["DEFAULT_PRODUCT"]
        assert run_job(product, job_id) == "done"
        assert run_job(product, job_id) == "done"
    assert len(handler.messages) == 6
    rows = {r["seq"]: r for r in _recipients(client, job_id, headers)}
    assert rows[4]["status"] == "failed" and "not resent" in rows[4]["error"]
    assert rows[0]["status"] == "sent"


@pytest.mark.parametrize("body,field", [
    ({}, "recipients"),
    ({"recipients": [], "subject": "s", "body": "b"}, "recipients"),
    ({"recipients": ["nope"], "subject": "s", "body": "b"}, "recipients"),
    ({"recipients": ["a@example.com"], "body": "b"}, "subject"),
    ({"recipients": ["a@example.com"], "subject": "a\r\nBcc: x@example.com", "body": "b"}, "subject"),
    ({"messages": [{"to": "a@example.com", "subject": "s"}]}, "body"),
    ({"messages": [{"to": ["a@example.com"], "subject": "s", "body": "b"}]}, "to"),
    ({"messages": [{"to": "a@example.com", "subject": "s", "body": "b"}], "subject": "x"}, "subject"),
    ({"recipients": ["a@example.com"] * 10_001, "subject": "s", "body": "b"}, "recipients"),
    ({"recipients": ["a@example.com"], "subject": "s", "body": "b", "cc": []}, "cc"),
])
def test_bulk_validation(client, auth, body, field):
    resp = client.post(BULK, json=body, headers=auth("write:notifications"))
    assert resp.status_code == 400, resp.get_json()
    assert field in str(resp.get_json()["error"]["details"])


def test_bulk_scopes_and_tenancy(client, auth, make_token):
    assert client.post(BULK, json={"recipients": ["a@example.com"], "subject": "s", "body": "b"},
                       headers=auth("read")).status_code == 403
    resp = client.post(BULK, json={"recipients": ["a@example.com"], "subject": "s", "body": "b"},
                       headers=auth("write:notifications"))
    assert resp.status_code == 202
    other = {"Authorization": f"Bearer {make_token(scopes=['write:notifications'], org='another-org')}"}
    assert client.get(resp.get_json()["statusUrl"], headers=other).status_code == 404
    assert client.get(f"{BULK}/{uuid.uuid4()}", headers=auth("write:notifications")).status_code == 404
    assert client.get(f"{BULK}/{resp.get_json()['jobId']}/recipients?limit=0",
                      headers=auth("write:notifications")).status_code == 400
    for after in (2**31, 10**23):  # past the cursor's integer column: the field is named (was the
        # database's conversion error, 400 about "filter, sort or aggregate" naming nothing)
        bad = client.get(f"{BULK}/{resp.get_json()['jobId']}/recipients?after={after}",
                         headers=auth("write:notifications"))
        assert bad.status_code == 400 and "after" in bad.get_json()["error"]["details"]["fields"], bad.get_json()
    assert client.get(f"{BULK}/{resp.get_json()['jobId']}/recipients?after={2**31 - 1}",
                      headers=auth("write:notifications")).status_code == 200


def test_newsletter_subscribe_list_unsubscribe(client, auth):
    headers = auth("write:notifications")
    first = client.post(f"{NEWS}/subscribers", json={"email": "Ann@Example.com", "name": "Ann"}, headers=headers)
    assert first.status_code == 201 and first.get_json()["subscriber"]["email"] == "ann@example.com"
    again = client.post(f"{NEWS}/subscribers", json={"email": "ann@example.com"}, headers=headers)
    assert again.status_code == 200 and again.get_json()["subscriber"]["name"] == "Ann"
    client.post(f"{NEWS}/subscribers", json={"email": "bob@example.com"}, headers=headers)
    listed = client.get(f"{NEWS}/subscribers", headers=headers).get_json()["subscribers"]
    assert [s["email"] for s in listed] == ["ann@example.com", "bob@example.com"]
    gone = client.delete(f"{NEWS}/subscribers/bob@example.com", headers=headers)
    assert gone.status_code == 200 and gone.get_json()["subscriber"]["status"] == "unsubscribed"
    active = client.get(f"{NEWS}/subscribers?status=active", headers=headers).get_json()["subscribers"]
    assert [s["email"] for s in active] == ["ann@example.com"]
    back = client.post(f"{NEWS}/subscribers", json={"email": "bob@example.com"}, headers=headers)
    assert back.status_code == 201 and back.get_json()["subscriber"]["status"] == "active"
    assert client.delete(f"{NEWS}/subscribers/nobody@example.com", headers=headers).status_code == 404
    assert client.post(f"{NEWS}/subscribers", json={"email": "x"}, headers=headers).status_code == 400
    assert client.post(f"{NEWS}/subscribers", json={"email": "a@b.co"}, headers=auth("read")).status_code == 403
    page = client.get(f"{NEWS}/subscribers?limit=1", headers=headers).get_json()
    assert page["nextCursor"] == "ann@example.com"
    nxt = client.get(f"{NEWS}/subscribers?limit=1&after=ann@example.com", headers=headers).get_json()
    assert [s["email"] for s in nxt["subscribers"]] == ["bob@example.com"]


def test_newsletter_issue_with_list_unsubscribe_and_token_link(mail_app, sink, auth):
    handler, port = sink
    client = mail_app(port).test_client()
    headers = auth("write:notifications")
    for addr in ("n1@example.com", "n2@example.com", "n3@example.com"):
        client.post(f"{NEWS}/subscribers", json={"email": addr}, headers=headers)
    client.delete(f"{NEWS}/subscribers/n3@example.com", headers=headers)
    resp = client.post(f"{NEWS}/issues", json={"subject": "Issue #1", "body": "<p>News</p>"}, headers=headers)
    assert resp.status_code == 202 and resp.get_json()["total"] == 2
    issues = client.get(f"{NEWS}/issues", headers=headers).get_json()["issues"]
    assert issues[0]["id"] == resp.get_json()["jobId"] and issues[0]["counts"]["sent"] == 2
    by_to = {email.message_from_bytes(c)["To"]: email.message_from_bytes(c) for _, c in handler.messages}
    assert set(by_to) == {"n1@example.com", "n2@example.com"}
    msg = by_to["n1@example.com"]
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = msg["List-Unsubscribe"].strip("<>")
    parts = urlsplit(link)
    assert parts.path == f"{NEWS}/unsubscribe"
    token = parse_qs(parts.query)["token"][0]

    # no login: GET shows a confirmation page, POST (one-click) unsubscribes, idempotently
    page = client.get(f"{parts.path}?{parts.query}")
    assert page.status_code == 200 and b"n1@example.com" in page.data and b"<form" in page.data
    assert client.get(f"{NEWS}/subscribers?status=active", headers=headers).get_json()["subscribers"][0][
        "email"] == "n1@example.com"
    done = client.post(f"{parts.path}?{parts.query}", data={"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200 and done.get_json() == {"success": True, "email": "n1@example.com",
                                                          "status": "unsubscribed"}
    assert client.post(f"{parts.path}?{parts.query}").status_code == 200
    active = client.get(f"{NEWS}/subscribers?status=active", headers=headers).get_json()["subscribers"]
    assert [s["email"] for s in active] == ["n2@example.com"]

    # tampered, truncated or missing tokens
    payload, sig = token.split(".")
    for bad in (f"{payload}.{sig[:-2]}xx", payload, "", "a.b.c", f"{payload[:-4]}.{sig}"):
        resp = client.post(f"{NEWS}/unsubscribe", query_string={"token": bad})
        assert resp.status_code in (400, 401), (bad, resp.status_code)
    assert client.post(f"{NEWS}/unsubscribe").status_code == 400


def test_bulk_on_a_real_worker(celery_worker, client, auth, app):
    """With Redis, the job is queued on `email` and a worker sends it (console backend)."""
    from tests.conftest import wait_for

    headers = auth("write:notifications")
    resp = client.post(BULK, json={"recipients": ["w1@example.com", "w2@example.com"], "subject": "s",
                                   "body": "b"}, headers=headers)
    assert resp.status_code == 202

    def done():
        job = client.get(resp.get_json()["statusUrl"], headers=headers).get_json()["job"]
        return job["status"] == "done" and job

    job = wait_for(done, timeout=60)
    assert job["counts"]["sent"] == 2


# --------------------------------------------------------------------------- slices, lease and reaper


def _outbox_rows(app, prefix):
    from sqlalchemy import delete, select

    from app.db import db
    from app.platform_models import OutboxMessage
    from app.tasks import lease_of

    with db.engine.begin() as conn:  # read and take them: the test plays the worker
        rows = conn.execute(select(OutboxMessage.id, OutboxMessage.task_name, OutboxMessage.args,
                                   OutboxMessage.kwargs).where(OutboxMessage.key_prefix == prefix)).all()
        conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
    # the dispatch token travels in the task id, never as an argument (the previous release's task
    # takes none: a rollback must not strand a job mid-chain)
    assert all(r.kwargs == {} and len(r.args) == 2 and lease_of(r.id)[0] == r.args[1] for r in rows), rows
    return [(r.task_name, r.args, {"token": lease_of(r.id)[1]}) for r in rows]


def test_slices_chain_through_the_outbox_and_the_reaper_sends_a_lost_slice_again(mail_app, sink, auth):
    """A job of 12 recipients in slices of 5: each slice writes the next one's message to the outbox
    with a new dispatch token; a duplicate of an old message does nothing; a lost message is sent again
    by the lease reaper once the lease expired and no worker holds the job; nobody gets two messages."""
    from sqlalchemy import update

    from app.db import db
    from app.email.bulk import _job_lock, requeue_stalled_jobs, run_job
    from app.email.models import EmailJob
    from app.wire import utcnow

    handler, port = sink
    prefix = f"test-email-{uuid.uuid4().hex[:8]}:"
    app = mail_app(port, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                   EMAIL_BULK_SLICE_SIZE=5)  # a broker that is down: every message stays in the outbox
    client, headers = app.test_client(), auth("write:notifications")
    rcpts = [f"s{i}@example.com" for i in range(12)]
    resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["jobId"]
    product = app.config["DEFAULT_PRODUCT"]

    def job():
        return client.get(f"{BULK}/{job_id}", headers=headers).get_json()["job"]

    with app.app_context():
        assert job()["status"] == "queued" and not handler.messages
        assert _outbox_rows(app, prefix) == [("email.bulk_send", [product, job_id], {"token": 0})]
        outcome = run_job(product, job_id, 0, slice_size=5)
        assert outcome == "continued", (outcome, len(handler.messages), job())
        assert len(handler.messages) == 5 and job()["status"] == "sending"
        assert _outbox_rows(app, prefix) == [("email.bulk_send", [product, job_id], {"token": 1})]
        assert run_job(product, job_id, 0, slice_size=5) == "stale"  # a duplicate of slice 1's message
        # slice 2's message is lost (taken above, never run): within the lease nothing happens ...
        assert requeue_stalled_jobs() == 0
        db.session.execute(update(EmailJob).where(EmailJob.id == job_id).values(lease_expires_at=utcnow()))
        db.session.commit()
        with _job_lock(job_id) as held:  # ... nor while a worker holds the job (its slice renews the lease)
            assert held and requeue_stalled_jobs() == 0
        assert requeue_stalled_jobs() == 1  # past the lease, nobody holding it: sent again, same token
        assert _outbox_rows(app, prefix) == [("email.bulk_send", [product, job_id], {"token": 1})]
        assert run_job(product, job_id, 1, slice_size=5) == "continued"
        assert run_job(product, job_id, 1, slice_size=5) == "stale"  # the lost message, should it turn up
        assert run_job(*_outbox_rows(app, prefix)[0][1], 2, slice_size=5) == "done"
        assert _outbox_rows(app, prefix) == [] and requeue_stalled_jobs() == 0
    assert job()["status"] == "done" and job()["counts"]["sent"] == 12
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert set(delivered) == set(rcpts) and set(delivered.values()) == {1}


def test_bulk_send_message_takes_its_token_from_the_task_id(mail_app, sink, auth):
    """The slice's message is `email.bulk_send(product, job_id)` with the token in its task id: the
    release before slices runs it (it takes no `token` argument; a rollback used to fail every message
    of a job mid-chain). A message of the release that passed `token=` still runs."""
    from app.email.tasks import bulk_send
    from app.tasks import lease_message_id

    handler, port = sink
    prefix = f"test-email-{uuid.uuid4().hex[:8]}:"
    app = mail_app(port, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                   EMAIL_BULK_SLICE_SIZE=2)
    client, headers = app.test_client(), auth("write:notifications")
    rcpts = [f"t{i}@example.com" for i in range(5)]
    resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
    job_id = resp.get_json()["jobId"]
    product = app.config["DEFAULT_PRODUCT"]
    with app.app_context():
        [(_, args, kwargs)] = _outbox_rows(app, prefix)
        assert args == [product, job_id] and kwargs == {"token": 0}
        stale = bulk_send.apply(args=args, task_id=lease_message_id(job_id, 7))  # not the job's token
        assert stale.result == "stale" and not handler.messages
        # the previous release's form: its `token=` is read (while the job is unfinished: a finished job
        # answers "done" whatever the token), and wins over a task id's
        assert bulk_send.apply(args=args, kwargs={"token": 7}).result == "stale"
        assert bulk_send.apply(args=args, kwargs={"token": 7}, task_id=lease_message_id(job_id, 0)).result == "stale"
        assert not handler.messages
        # eager apply sends the whole job: its token (0) comes from the task id
        assert bulk_send.apply(args=args, task_id=lease_message_id(job_id, 0)).result == "done"
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert set(delivered) == set(rcpts) and set(delivered.values()) == {1}


class HoldingHandler(SinkHandler):
    """Holds the RCPT of `hold*` addresses until `release` is set (a worker stuck mid-slice), or, with
    `until_dropped`, until the client's connection is gone (a worker killed by the task time limit):
    every time (`times=None`) or the first `times` times. `held` counts the RCPTs held."""

    def __init__(self, *, until_dropped: bool = False, times: int | None = None):
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.until_dropped, self.times, self.held = until_dropped, times, 0

    def _hold(self, server) -> bool:
        if self.release.is_set():
            return False
        if self.until_dropped:
            transport = server.transport
            return transport is not None and not transport.is_closing()
        return True

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("hold") and (self.times is None or self.held < self.times):
            import asyncio

            with self.lock:
                self.held += 1
            self.holding.set()
            while self._hold(server):
                await asyncio.sleep(0.05)
            if self.until_dropped and not self.release.is_set():
                return "421 gone"  # the client is gone; nothing more happens on this connection
        return await super().handle_RCPT(server, session, envelope, address, rcpt_options)


def test_worker_killed_mid_slice_the_reaper_finishes_the_job_once(make_app, database_url, redis_url, auth):
    """kill -9 of a real worker in the middle of a job's second slice: the job's advisory lock ends
    with the worker's connection, its lease expires, and the next worker's reaper sends the rest. Every
    recipient ends up sent exactly once: the two delivered before the kill are `sent` (each outcome is
    committed as it comes, not with its chunk), the one the worker was holding at RCPT (before DATA: the
    server discards that transaction) and the one not yet tried are sent by the next worker.
    (Before: all four rows of the slice were reported failed, two of them never delivered.)"""
    import os
    import signal

    from tests.conftest import start_worker, stop_worker, wait_for

    handler = HoldingHandler()
    controller = _server(handler)
    prefix = f"test-email-lease-{uuid.uuid4().hex[:8]}:"
    app = make_app(CELERY_KEY_PREFIX=prefix, REDIS_URL=redis_url)
    client, headers = app.test_client(), auth("write:notifications")
    env = {"EMAIL_BACKEND": "smtp", "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(controller.port),
           "SMTP_STARTTLS": "0", "EMAIL_BULK_SLICE_SIZE": "4", "EMAIL_BULK_CONCURRENCY": "1",
           "EMAIL_BULK_LEASE_SECONDS": "2", "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1",
           "OUTBOX_DISPATCH_AFTER_SECONDS": "1"}
    rcpts = [f"k{i}@example.com" for i in range(10)]
    rcpts[6] = "hold6@example.com"  # slice 2 is k4..k7: k4 and k5 go out, then the worker stalls on 6
    worker = None
    try:
        resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
        assert resp.status_code == 202, resp.get_json()
        status_url = resp.get_json()["statusUrl"]
        worker = start_worker(database_url, redis_url, prefix=prefix, queues="email", concurrency=1,
                              log_name="worker-email-lease-1.log", extra_env=env)
        assert handler.holding.wait(60)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        handler.release.set()
        job = client.get(status_url, headers=headers).get_json()["job"]
        # slice 1 done; of slice 2, k4 and k5 recorded as they went, hold6 and k7 orphaned in `sending`
        assert job["status"] == "sending" and job["counts"]["sent"] == 6 and job["counts"]["sending"] == 2

        worker = start_worker(database_url, redis_url, prefix=prefix, queues="email", concurrency=1,
                              log_name="worker-email-lease-2.log", extra_env=env)

        def done():
            job = client.get(status_url, headers=headers).get_json()["job"]
            return job["status"] == "done" and job

        job = wait_for(done, timeout=90)
    finally:
        handler.release.set()
        if worker is not None:
            stop_worker(worker)
        controller.stop()
    rows = {r["to"]: r for r in _recipients(client, resp.get_json()["jobId"], headers)}
    assert {to for to, r in rows.items() if r["status"] == "sent"} == set(rcpts)
    assert job["counts"] == {"pending": 0, "sending": 0, "sent": 10, "failed": 0} and job["error"] is None
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert delivered == Counter(rcpts)  # everyone once, nobody twice


def _time_limited_email_worker(make_app, database_url, redis_url, auth, handler, port, rcpts, **env):
    """Send `rcpts` as one bulk job through a real worker whose tasks are killed after 2 s (the hard time
    limit; no soft limit), with 1 s leases, until the job is `done`; returns (client, headers, job)."""
    from tests.conftest import start_worker, stop_worker, wait_for

    prefix = f"test-email-limit-{uuid.uuid4().hex[:8]}:"
    # the limit travels with the message, from the app that sent it: the API's settings too
    app = make_app(CELERY_KEY_PREFIX=prefix, REDIS_URL=redis_url, CELERY_TASK_TIME_LIMIT=2,
                   CELERY_TASK_SOFT_TIME_LIMIT=0)
    client, headers = app.test_client(), auth("write:notifications")
    env = {"EMAIL_BACKEND": "smtp", "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(port), "SMTP_STARTTLS": "0",
           "EMAIL_BULK_CONCURRENCY": "1", "EMAIL_BULK_LEASE_SECONDS": "1", "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1",
           "OUTBOX_DISPATCH_AFTER_SECONDS": "1", "CELERY_TASK_TIME_LIMIT": "2", "CELERY_TASK_SOFT_TIME_LIMIT": "0",
           **env}
    worker = start_worker(database_url, redis_url, prefix=prefix, queues="email", concurrency=1,
                          log_name="worker-email-limit.log", extra_env=env)
    try:
        resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
        assert resp.status_code == 202, resp.get_json()
        status_url = resp.get_json()["statusUrl"]

        def done():
            job = client.get(status_url, headers=headers).get_json()["job"]
            return job["status"] == "done" and job

        return client, headers, wait_for(done, timeout=120)
    finally:
        handler.release.set()
        stop_worker(worker)


def test_slice_killed_by_the_task_time_limit_is_reaped_and_each_recipient_sent_once(make_app, database_url,
                                                                                    redis_url, auth):
    """Issue 22: a bulk-email slice past the task time limit no longer stays `sending`. The worker kills
    the task (CELERY_TASK_TIME_LIMIT) while it waits on the server at hold2's RCPT; its job lock ends with
    the task's process, the lease reaper sends the slice again, and the next run sends hold2 (it never
    reached DATA) and k3: everyone once. (Before: the limit was fixed at 600 s, and the re-run failed
    hold2 and k3 as "not resent".)"""
    handler = HoldingHandler(until_dropped=True, times=1)
    controller = _server(handler)
    rcpts = ["k0@example.com", "k1@example.com", "hold2@example.com", "k3@example.com"]
    try:
        client, headers, job = _time_limited_email_worker(make_app, database_url, redis_url, auth, handler,
                                                          controller.port, rcpts)
    finally:
        controller.stop()
    assert handler.held == 1  # the first run was stopped there
    assert job["counts"] == {"pending": 0, "sending": 0, "sent": 4, "failed": 0}
    assert Counter(r for rcpt, _ in handler.messages for r in rcpt) == Counter(rcpts)
    # one try: the killed run's never reached DATA, so it does not count (an SMTP timeout would be a try)
    assert [r["attempts"] for r in _recipients(client, job["id"], headers) if r["to"] == rcpts[2]] == [1]
    assert job["error"] is None


def test_job_whose_every_run_hits_the_time_limit_ends_with_the_reason(make_app, database_url, redis_url, auth):
    """A slice killed by the time limit on every run, before it records a single delivery, is not sent
    again forever: after JOB_MAX_ATTEMPTS runs the reaper ends the job, its unsent recipients failed with
    the reason, which is also the job's `error` (GET /email/bulk-send/{id})."""
    handler = HoldingHandler(until_dropped=True)
    controller = _server(handler)
    rcpts = ["hold0@example.com", "k1@example.com", "k2@example.com"]
    try:
        client, headers, job = _time_limited_email_worker(make_app, database_url, redis_url, auth, handler,
                                                          controller.port, rcpts, JOB_MAX_ATTEMPTS="2")
    finally:
        controller.stop()
    # two counted runs, each stopped at hold0, nothing sent; under load a third delivery can reach the SMTP
    # server before its run is counted (it is killed by the same limit), so the count is a lower bound
    assert handler.held >= 2 and handler.messages == []
    assert job["counts"] == {"pending": 0, "sending": 0, "sent": 0, "failed": 3}
    # JOB_MAX_ATTEMPTS=2 with a 1 s lease: under load the reaper can send the job again while its message
    # still waits in the queue, and that run is counted too, so the job may end after a third run
    runs = re.search(r"Stopped after (\d+) interrupted run", job["error"])
    assert "time limit" in job["error"] and runs and int(runs.group(1)) >= 2, job
    rows = _recipients(client, job["id"], headers)
    assert {r["error"] for r in rows} == {job["error"]}


def test_newsletter_issue_above_the_recipient_cap_is_refused(mail_app, sink, auth):
    """NEWSLETTER_MAX_RECIPIENTS: an issue to more active subscribers is 400 VALIDATION_ERROR in the
    envelope, naming the count and the cap; no job is created. At the cap it is sent."""
    handler, port = sink
    client = mail_app(port, NEWSLETTER_MAX_RECIPIENTS=2).test_client()
    headers = auth("write:notifications")
    for addr in ("c1@example.com", "c2@example.com", "c3@example.com"):
        assert client.post(f"{NEWS}/subscribers", json={"email": addr}, headers=headers).status_code == 201
    resp = client.post(f"{NEWS}/issues", json={"subject": "Too many", "body": "b"}, headers=headers)
    assert resp.status_code == 400, resp.get_json()
    body = resp.get_json()
    assert body["error"]["code"] == "VALIDATION_ERROR" and body["metadata"]["success"] is False
    assert body["error"]["details"] == {"activeSubscribers": 3, "maxRecipients": 2}
    assert "at most 2" in body["error"]["message"]
    assert client.get(f"{NEWS}/issues", headers=headers).get_json()["issues"] == [] and not handler.messages
    client.delete(f"{NEWS}/subscribers/c3@example.com", headers=headers)
    resp = client.post(f"{NEWS}/issues", json={"subject": "Fits", "body": "b"}, headers=headers)
    assert resp.status_code == 202 and resp.get_json()["total"] == 2
    assert len(handler.messages) == 2


def test_next_slice_waits_for_the_previous_slice_to_let_go_of_the_job(mail_app, sink, auth):
    """A slice's message can arrive while the worker of the previous slice still holds the job's lock
    (it is sent at that slice's commit): it waits for the lock instead of answering `busy` and ending
    the chain until the reaper. The holder here lets go once the waiting slice has tried at least once."""
    from sqlalchemy import select, text

    from app.db import db
    from app.email.bulk import _job_lock, run_job
    from app.email.models import EmailJob

    handler, port = sink
    prefix = f"test-email-{uuid.uuid4().hex[:8]}:"
    app = mail_app(port, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix)
    client, headers = app.test_client(), auth("write:notifications")
    resp = client.post(BULK, json={"recipients": ["w1@example.com", "w2@example.com"], "subject": "s", "body": "b"},
                       headers=headers)
    job_id = resp.get_json()["jobId"]
    product = app.config["DEFAULT_PRODUCT"]
    holding, tried, outcome = threading.Event(), threading.Event(), {}

    def previous_slice():
        with app.app_context(), _job_lock(job_id) as held:
            assert held
            holding.set()
            tried.wait(30)

    def waiting_attempt_seen():  # holder and waiter both sit on a pg_try_advisory_lock (the waiter's failed)
        with app.app_context(), db.engine.connect() as conn:
            return conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                                    "'SELECT pg_try_advisory_lock%' AND state = 'idle in transaction'")) >= 2

    holder = threading.Thread(target=previous_slice)
    holder.start()
    assert holding.wait(30)
    waiter = threading.Thread(target=lambda: outcome.setdefault("r", _run(app, run_job, product, job_id)))
    waiter.start()
    from tests.conftest import wait_for

    wait_for(lambda: "r" in outcome or waiting_attempt_seen(), timeout=30, interval=0.05)
    tried.set()
    holder.join(30)
    waiter.join(60)
    assert outcome["r"] == "done" and len(handler.messages) == 2
    with app.app_context():
        assert db.session.scalar(select(EmailJob.status).where(EmailJob.id == job_id)) == "done"


def _run(app, run_job, product, job_id):
    with app.app_context():
        return run_job(product, job_id, 0, slice_size=5)


def test_reaper_does_not_invalidate_a_message_that_is_only_waiting_in_the_queue(mail_app, sink, auth):
    """A slice's message that waited in a busy `email` queue longer than the lease has not been lost:
    the reaper sends the job again under the same token, and whichever of the two messages runs first
    sends the slice (the other finds the token moved on). Were the waiting message made stale, a queue
    backlog longer than the lease would push every job to the back of the queue again and again."""
    from sqlalchemy import update

    from app.db import db
    from app.email.bulk import requeue_stalled_jobs, run_job
    from app.email.models import EmailJob
    from app.wire import utcnow

    handler, port = sink
    prefix = f"test-email-{uuid.uuid4().hex[:8]}:"
    app = mail_app(port, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                   EMAIL_BULK_SLICE_SIZE=5)
    client, headers = app.test_client(), auth("write:notifications")
    rcpts = [f"q{i}@example.com" for i in range(3)]
    resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
    job_id = resp.get_json()["jobId"]
    with app.app_context():
        [(_, args, kwargs)] = _outbox_rows(app, prefix)  # the message now waits in the queue ...
        db.session.execute(update(EmailJob).where(EmailJob.id == job_id).values(lease_expires_at=utcnow()))
        db.session.commit()  # ... longer than the lease
        assert requeue_stalled_jobs() == 1
        [(_, args2, kwargs2)] = _outbox_rows(app, prefix)
        assert run_job(*args, **kwargs, slice_size=5) == "done"  # the waiting message reaches a worker
        assert run_job(*args2, **kwargs2, slice_size=5) in ("done", "stale")  # the reaper's: nothing to do
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert set(delivered) == set(rcpts) and set(delivered.values()) == {1}


def test_a_job_of_the_previous_release_is_adopted_by_the_deployment_that_runs_it(mail_app, sink, auth):
    """m0002 leaves `key_prefix` empty on the previous release's jobs (it cannot know the deployment);
    the first slice a worker runs for such a job stamps the worker's deployment on it, so a prefixed
    deployment's reaper covers the job from then on (it used to stay outside every reaper)."""
    from sqlalchemy import select, update

    from app.db import db
    from app.email.bulk import requeue_stalled_jobs, run_job
    from app.email.models import EmailJob
    from app.wire import utcnow

    handler, port = sink
    prefix = f"test-email-{uuid.uuid4().hex[:8]}:"
    app = mail_app(port, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                   EMAIL_BULK_SLICE_SIZE=2)
    client, headers = app.test_client(), auth("write:notifications")
    rcpts = [f"p{i}@example.com" for i in range(5)]
    resp = client.post(BULK, json={"recipients": rcpts, "subject": "s", "body": "b"}, headers=headers)
    job_id = resp.get_json()["jobId"]
    product = app.config["DEFAULT_PRODUCT"]
    with app.app_context():
        _outbox_rows(app, prefix)
        db.session.execute(update(EmailJob).where(EmailJob.id == job_id).values(  # as m0002 left it
            key_prefix="", lease_expires_at=None))
        db.session.commit()
        assert run_job(product, job_id, None, slice_size=2) == "continued"  # the old release's message
        assert db.session.scalar(select(EmailJob.key_prefix).where(EmailJob.id == job_id)) == prefix
        _outbox_rows(app, prefix)  # the next slice's message is lost
        db.session.execute(update(EmailJob).where(EmailJob.id == job_id).values(lease_expires_at=utcnow()))
        db.session.commit()
        assert requeue_stalled_jobs() == 1
        while (rows := _outbox_rows(app, prefix)):
            run_job(*rows[0][1], **rows[0][2], slice_size=2)
    delivered = Counter(r for rcpt, _ in handler.messages for r in rcpt)
    assert set(delivered) == set(rcpts) and set(delivered.values()) == {1}
