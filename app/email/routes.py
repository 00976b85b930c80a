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
from app.extensions import Blueprint
from app.ratelimit import rate_limited
from app.tenancy import current_tenant
from app.wire import accepted

blp = Blueprint("email", __name__, url_prefix="/api/v1/email", description="Outbound email")
newsletter_blp = Blueprint("newsletter", __name__, url_prefix="/api/v1/newsletter",
                           description="Newsletter subscribers and issues")
blueprints = [blp, newsletter_blp]
WRITE = "write:notifications"
READ = ("read:notifications", "write:notifications")


@blp.route("/send")
class SendEmail(MethodView):
    @blp.arguments(SendEmailRequestSchema)
    @blp.response(200, SendEmailResponseSchema)
    @blp.requires(WRITE)
    @rate_limited("email")
    @blp.idempotent
    def post(self, payload):
        """Send one pre-rendered email. Check `success`: delivery failures answer 200 with success false."""
        result = send_email(payload["to"], payload["subject"], payload["body"], current_tenant())
        return {"success": result.success, "message": result.message}


def _accepted(job) -> Response:
    url = f"/api/v1/email/bulk-send/{job.id}"
    return accepted({"jobId": job.id, "status": job.status, "total": job.total, "statusUrl": url}, url)


@blp.route("/bulk-send")
class BulkSend(MethodView):
    @blp.arguments(s.BulkSendRequestSchema)
    @blp.response(202, s.EmailJobAcceptedSchema)
    @blp.requires(WRITE)
    @rate_limited("email")
    @blp.idempotent
    def post(self, payload):
        """Queue many messages (`messages`) or one message to many `recipients` (≤ 10 000): 202 with a
        job id. Workers send one message per recipient; follow the job at `statusUrl`."""
        limit = current_app.config["EMAIL_BULK_MAX_RECIPIENTS"]
        items = payload.get("messages") or payload.get("recipients") or []
        if len(items) > limit:
            key = "messages" if "messages" in payload else "recipients"
            raise ValidationFailed(f"At most {limit} {key} per request.", {"fields": {key: [f"at most {limit}"]}})
        return _accepted(bulk.create_bulk_job(db.session, current_tenant(), payload))


@blp.route("/bulk-send/<string:jobId>")
class BulkJob(MethodView):
    @blp.response(200, s.JobEnvelopeSchema)
    @blp.requires(*READ)
    def get(self, jobId):
        """A bulk job (or newsletter issue): status and counts per delivery state."""
        return {"job": bulk.job_to_wire(bulk.get_job(jobId))}


@blp.route("/bulk-send/<string:jobId>/recipients")
class BulkJobRecipients(MethodView):
    @blp.arguments(s.DeliveryQuerySchema, location="query")
    @blp.response(200, s.DeliveryListSchema)
    @blp.requires(*READ)
    def get(self, args, jobId):
        """Per-recipient outcome (status, attempts, SMTP code, error), by `seq`; filter by `status`."""
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
        """Subscribers of the org by email (filter `status`; page with `after` = last email)."""
        subs = newsletter.list_subscribers(args.get("status"), args.get("after"), args["limit"])
        return {"subscribers": [newsletter.subscriber_to_wire(x) for x in subs],
                "nextCursor": subs[-1].email if len(subs) == args["limit"] else None}

    @newsletter_blp.arguments(s.SubscribeSchema)
    @newsletter_blp.response(201, s.SubscriberEnvelopeSchema)
    @newsletter_blp.alt_response(200, schema=s.SubscriberEnvelopeSchema, description="Already subscribed")
    @newsletter_blp.requires(WRITE)
    @newsletter_blp.idempotent
    def post(self, data):
        """Subscribe an address (201), or re-activate an unsubscribed one; an active one answers 200."""
        sub, changed = newsletter.subscribe(db.session, current_tenant(), data["email"], data.get("name"),
                                           data.get("source"))
        return {"subscriber": newsletter.subscriber_to_wire(sub)}, 201 if changed else 200


@newsletter_blp.route("/subscribers/<string:subscriber>")
class Subscriber(MethodView):
    @newsletter_blp.response(200, s.SubscriberEnvelopeSchema)
    @newsletter_blp.requires(WRITE)
    def delete(self, subscriber):
        """Unsubscribe by id or email address (the row is kept as `unsubscribed`)."""
        sub = newsletter.unsubscribe(db.session, current_tenant(), subscriber)
        return {"subscriber": newsletter.subscriber_to_wire(sub)}


@newsletter_blp.route("/issues")
class Issues(MethodView):
    @newsletter_blp.response(200, s.IssueListSchema)
    @newsletter_blp.requires(*READ)
    def get(self):
        """The 50 most recent issues (bulk jobs of kind newsletter)."""
        return {"issues": [bulk.job_to_wire(j) for j in newsletter.list_issues()]}

    @newsletter_blp.arguments(s.IssueRequestSchema)
    @newsletter_blp.response(202, s.EmailJobAcceptedSchema)
    @newsletter_blp.requires(WRITE)
    @rate_limited("email")
    @newsletter_blp.idempotent
    def post(self, data):
        """Send an issue to every active subscriber through the bulk path; each message carries
        `List-Unsubscribe` (link + one-click POST). More active subscribers than the deployment's cap
        (NEWSLETTER_MAX_RECIPIENTS, default 50 000) is 400 VALIDATION_ERROR with
        `details.activeSubscribers` and `details.maxRecipients`; nothing is queued."""
        return _accepted(newsletter.send_issue(db.session, current_tenant(), data["subject"], data["body"]))


@newsletter_blp.route("/unsubscribe")
class Unsubscribe(MethodView):
    @newsletter_blp.arguments(s.TokenQuerySchema, location="query")
    @newsletter_blp.response(200, description="An HTML page with a confirmation button")
    @newsletter_blp.doc(security=[])
    def get(self, args):
        """The link of the email (no login): a confirmation page; mail scanners that follow links
        therefore do not unsubscribe anyone."""
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
        """Unsubscribe (RFC 8058 one-click: `List-Unsubscribe=One-Click` form body); idempotent."""
        sub = newsletter.subscriber_by_token(args["token"], unsubscribe=True)
        if request.accept_mimetypes.best == "text/html":
            return Response(f"<!doctype html><meta charset=utf-8><p>{html.escape(sub.email)} is unsubscribed.</p>",
                            mimetype="text/html")
        return {"success": True, "email": sub.email, "status": sub.status}
