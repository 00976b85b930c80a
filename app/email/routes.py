"""Email: POST /api/v1/email/send, bulk send (/api/v1/email/bulk-send…), newsletter (/api/v1/newsletter/…)."""

from __future__ import annotations

import html

from flask import Response, current_app, request
from flask.views import MethodView

from app.db import db
from app.email import bulk, newsletter
from app.email import schemas as s
from app.email.schemas import SendEmailRequestSchema, SendEmailResponseSchema
from app.email.services import send_email
from app.errors import ValidationFailed
from app.extensions import Blueprint, path_param
from app.ratelimit import rate_limited
from app.tenancy import current_tenant
from app.wire import accepted

blp = Blueprint("email", __name__, url_prefix="/api/v1/email", tag="Email", description="Outbound email")
newsletter_blp = Blueprint("newsletter", __name__, url_prefix="/api/v1/newsletter", tag="Newsletter",
                           description="Newsletter subscribers and issues")
EMAIL_JOB = path_param("jobId", "The `jobId` of a bulk send or newsletter issue (their 202 answers).")
blueprints = [blp, newsletter_blp]
WRITE = "write:notifications"
READ = ("read:notifications", "write:notifications")


@blp.route("/send")
class SendEmail(MethodView):
    @blp.arguments(SendEmailRequestSchema, example=s.SEND_EXAMPLE)
    @blp.response(200, SendEmailResponseSchema)
    @blp.requires(WRITE)
    @rate_limited("email")
    @blp.idempotent
    def post(self, payload):
        """Send an email

        Sends one pre-rendered message (HTML or text, no templating) to 1–50 addresses, at once,
        through the configured backend (SMTP, or the console outbox in development). Check `success`:
        a delivery failure (the server refused, a timeout) answers 200 with `success: false` and the
        reason in `message`.

        Errors: 400 VALIDATION_ERROR naming the field (an address that is not one, a subject with a line
        break); 429 RATE_LIMITED when the organization's email limit is spent.

        Example: the request example welcomes ann@example.com → `{"success": true, "message": "…"}`"""
        result = send_email(payload["to"], payload["subject"], payload["body"], current_tenant())
        return {"success": result.success, "message": result.message}


def _accepted(job) -> Response:
    url = f"/api/v1/email/bulk-send/{job.id}"
    return accepted({"jobId": job.id, "status": job.status, "total": job.total, "statusUrl": url}, url)


@blp.route("/bulk-send")
class BulkSend(MethodView):
    @blp.arguments(s.BulkSendRequestSchema, example=s.BULK_SEND_EXAMPLE)
    @blp.response(202, s.EmailJobAcceptedSchema)
    @blp.requires(WRITE)
    @rate_limited("email")
    @blp.idempotent
    def post(self, payload):
        """Send email in bulk

        Queues either one `subject` + `body` to many `recipients` (duplicates sent once) or many
        `messages`, each with its own recipient: at most 10 000 (EMAIL_BULK_MAX_RECIPIENTS). Answers 202
        with a job; workers send one message per recipient and retry temporary failures. Follow the job
        at `statusUrl`.

        Errors: 400 VALIDATION_ERROR for both forms at once, a missing field of the chosen form, an
        invalid address or too many recipients; 429 RATE_LIMITED when the organization's email limit
        is spent.

        Example: the request example sends one message to two addresses → 202 `{"jobId": "…", "status":
        "queued", "total": 2, "statusUrl": "/api/v1/email/bulk-send/…"}`"""
        limit = current_app.config["EMAIL_BULK_MAX_RECIPIENTS"]
        items = payload.get("messages") or payload.get("recipients") or []
        if len(items) > limit:
            key = "messages" if "messages" in payload else "recipients"
            raise ValidationFailed(f"At most {limit} {key} per request.", {"fields": {key: [f"at most {limit}"]}})
        return _accepted(bulk.create_bulk_job(db.session, current_tenant(), payload))


@blp.route("/bulk-send/<string:jobId>", parameters=[EMAIL_JOB])
class BulkJob(MethodView):
    @blp.response(200, s.JobEnvelopeSchema)
    @blp.requires(*READ)
    def get(self, jobId):
        """Get a bulk email job

        A bulk send or newsletter issue: `status` (queued, sending, done), `total` and `counts` per
        delivery state (pending, sending, sent, failed); `error` when the job was ended because its runs
        kept being interrupted (its unsent recipients are then failed with that reason).

        Errors: 404 NOT_FOUND for an unknown job (or one of another organization).

        Example: `GET /api/v1/email/bulk-send/{jobId}` → `{"job": {"id": "…", "kind": "bulk", "status":
        "done", "total": 2, "counts": {"pending": 0, "sending": 0, "sent": 2, "failed": 0}, "error": null, …}}`"""
        return {"job": bulk.job_to_wire(bulk.get_job(jobId))}


@blp.route("/bulk-send/<string:jobId>/recipients", parameters=[EMAIL_JOB])
class BulkJobRecipients(MethodView):
    @blp.arguments(s.DeliveryQuerySchema, location="query")
    @blp.response(200, s.DeliveryListSchema)
    @blp.requires(*READ)
    def get(self, args, jobId):
        """List a bulk job's recipients

        The outcome per recipient (status, attempts, SMTP code, error, sentAt), in queue order (`seq`);
        `status` keeps one state; `nextCursor` goes back as `after` for the next page.

        Errors: 404 NOT_FOUND for an unknown job; 400 for an unknown `status` or a `limit` out of 1–1000.

        Example: `GET /api/v1/email/bulk-send/{jobId}/recipients?status=failed` → `{"recipients": [{"seq":
        1, "to": "bob@example.com", "status": "failed", "attempts": 1, "smtpCode": 550, "error": "…"}],
        "nextCursor": null}`"""
        job = bulk.get_job(jobId)
        rows = bulk.list_deliveries(job, args.get("status"), args.get("after"), args["limit"])
        return {"recipients": [bulk.delivery_to_wire(r) for r in rows],
                "nextCursor": rows[-1].seq if len(rows) == args["limit"] else None}


# --------------------------------------------------------------------------- newsletter


@newsletter_blp.route("/subscribers")
class Subscribers(MethodView):
    @newsletter_blp.arguments(s.SubscriberQuerySchema, location="query")
    @newsletter_blp.response(200, s.SubscriberListSchema)
    @newsletter_blp.requires(*READ)
    def get(self, args):
        """List newsletter subscribers

        The organization's subscribers, by email address; `status` keeps active or unsubscribed ones;
        `nextCursor` (the last address) goes back as `after` for the next page.

        Errors: 400 for an unknown `status` or a `limit` out of 1–1000.

        Example: `GET /api/v1/newsletter/subscribers?status=active&limit=100` → `{"subscribers": [{"id":
        "…", "email": "ann@example.com", "status": "active", …}], "nextCursor": null}`"""
        subs = newsletter.list_subscribers(args.get("status"), args.get("after"), args["limit"])
        return {"subscribers": [newsletter.subscriber_to_wire(x) for x in subs],
                "nextCursor": subs[-1].email if len(subs) == args["limit"] else None}

    @newsletter_blp.arguments(s.SubscribeSchema, example=s.SUBSCRIBE_EXAMPLE)
    @newsletter_blp.response(201, s.SubscriberEnvelopeSchema)
    @newsletter_blp.alt_response(200, schema=s.SubscriberEnvelopeSchema, description="Already subscribed")
    @newsletter_blp.requires(WRITE)
    @newsletter_blp.idempotent
    def post(self, data):
        """Subscribe an address

        Adds the address to the organization's newsletter (201), or re-activates an unsubscribed one
        (201); an address that is already active answers 200, unchanged.

        Errors: 400 VALIDATION_ERROR for an invalid address.

        Example: the request example subscribes ann@example.com → 201 `{"subscriber": {"id": "…", "email":
        "ann@example.com", "status": "active", …}}` (200 the second time)."""
        sub, changed = newsletter.subscribe(db.session, current_tenant(), data["email"], data.get("name"),
                                           data.get("source"))
        return {"subscriber": newsletter.subscriber_to_wire(sub)}, 201 if changed else 200


@newsletter_blp.route("/subscribers/<string:subscriber>", parameters=[path_param(
    "subscriber", "The subscriber's `id` or email address.", "ann@example.com")])
class Subscriber(MethodView):
    @newsletter_blp.response(200, s.SubscriberEnvelopeSchema)
    @newsletter_blp.requires(WRITE)
    def delete(self, subscriber):
        """Unsubscribe a subscriber

        Unsubscribes by id or email address; the subscriber is kept, as `unsubscribed`, so a later issue
        skips it. Idempotent.

        Errors: 404 NOT_FOUND for an address or id the organization does not have.

        Example: `DELETE /api/v1/newsletter/subscribers/ann@example.com` → `{"subscriber": {"email":
        "ann@example.com", "status": "unsubscribed", …}}`"""
        sub = newsletter.unsubscribe(db.session, current_tenant(), subscriber)
        return {"subscriber": newsletter.subscriber_to_wire(sub)}


@newsletter_blp.route("/issues")
class Issues(MethodView):
    @newsletter_blp.response(200, s.IssueListSchema)
    @newsletter_blp.requires(*READ)
    def get(self):
        """List newsletter issues

        The 50 most recent issues, newest first: bulk jobs of kind `newsletter` with their status and
        counts per delivery state.

        Errors: none beyond authentication.

        Example: `GET /api/v1/newsletter/issues` → `{"issues": [{"id": "…", "kind": "newsletter", "subject":
        "November news", "status": "done", …}]}`"""
        return {"issues": [bulk.job_to_wire(j) for j in newsletter.list_issues()]}

    @newsletter_blp.arguments(s.IssueRequestSchema, example=s.ISSUE_EXAMPLE)
    @newsletter_blp.response(202, s.EmailJobAcceptedSchema)
    @newsletter_blp.requires(WRITE)
    @rate_limited("email")
    @newsletter_blp.idempotent
    def post(self, data):
        """Send a newsletter issue

        Queues the issue to every active subscriber through the bulk path (202 with the job, as a bulk
        send). Each message carries `List-Unsubscribe` (a link and a one-click POST, RFC 8058).

        Errors: 400 VALIDATION_ERROR when the organization has more active subscribers than the
        deployment's cap (NEWSLETTER_MAX_RECIPIENTS, default 50 000), with `details.activeSubscribers`
        and `details.maxRecipients`: nothing is queued; 429 RATE_LIMITED when the email limit is spent.

        Example: the request example → 202 `{"jobId": "…", "status": "queued", "total": 1, "statusUrl":
        "/api/v1/email/bulk-send/…"}`"""
        return _accepted(newsletter.send_issue(db.session, current_tenant(), data["subject"], data["body"]))


@newsletter_blp.route("/unsubscribe")
class Unsubscribe(MethodView):
    @newsletter_blp.arguments(s.TokenQuerySchema, location="query")
    @newsletter_blp.response(200, description="An HTML page with a confirmation button")
    @newsletter_blp.doc(security=[])
    def get(self, args):
        """Unsubscribe page

        The link of each newsletter message (no login): an HTML page with a confirmation button that
        POSTs to the same URL. Showing it changes nothing, so mail scanners that follow links
        unsubscribe nobody. `token` comes from the message's `List-Unsubscribe` link.

        Errors: 400 VALIDATION_ERROR for a token this deployment did not sign.

        Example: `GET /api/v1/newsletter/unsubscribe?token=…` → a page "Unsubscribe ann@example.com from
        this newsletter?"."""
        sub = newsletter.subscriber_by_token(args["token"])
        token = html.escape(args["token"], quote=True)
        page = (f"<!doctype html><meta charset=utf-8><title>Unsubscribe</title><p>Unsubscribe "
                f"<b>{html.escape(sub.email)}</b> from this newsletter?</p><form method=post action="
                f"\"?token={token}\"><button type=submit>Unsubscribe</button></form>")
        if sub.status == "unsubscribed":
            page = f"<!doctype html><meta charset=utf-8><p>{html.escape(sub.email)} is unsubscribed.</p>"
        return Response(page, mimetype="text/html")

    @newsletter_blp.arguments(s.TokenQuerySchema, location="query")
    @newsletter_blp.response(200, s.UnsubscribedSchema)
    @newsletter_blp.doc(security=[])
    def post(self, args):
        """Unsubscribe by link

        Unsubscribes the subscriber the `token` names (from the message's `List-Unsubscribe` link):
        the confirmation button of the page, or a mail client's one-click POST (RFC 8058, form body
        `List-Unsubscribe=One-Click`). Idempotent; no login.

        Errors: 400 VALIDATION_ERROR for a token this deployment did not sign.

        Example: `POST /api/v1/newsletter/unsubscribe?token=…` → `{"success": true, "email":
        "ann@example.com", "status": "unsubscribed"}`"""
        sub = newsletter.subscriber_by_token(args["token"], unsubscribe=True)
        if request.accept_mimetypes.best == "text/html":
            return Response(f"<!doctype html><meta charset=utf-8><p>{html.escape(sub.email)} is unsubscribed.</p>",
                            mimetype="text/html")
        return {"success": True, "email": sub.email, "status": sub.status}
