"""POST /internal/seed: cluster-internal organization seeding.

Authenticated like every route (app.auth): header `X-Internal-Token` equal to INTERNAL_API_TOKEN
(constant-time; with no token configured that path is closed), or a Bearer token with role admin or
super_admin (the role itself: scope `*` does not stand in for it here).
"""

from __future__ import annotations

from flask import current_app
from flask.views import MethodView

from app.errors import NotFound
from app.extensions import Blueprint, db
from app.ops.schemas import SeedQueuedSchema, SeedReportSchema, SeedStatusQuerySchema, SeedStatusSchema
from app.ops.seed_jobs import latest_request, queue_seed
from app.ops.seeding import SeedRequestSchema, org_id_for, seed_org, seed_status
from app.wire import accepted, wants_async

blp = Blueprint("internal", __name__, url_prefix="/internal",
                description="Cluster-internal operations (X-Internal-Token or an admin token)")
ADMIN_ROLES = ("admin", "super_admin")
internal_access = blp.requires(roles=ADMIN_ROLES, star_bypasses=False, internal_token=True)


@blp.route("/seed")
class Seed(MethodView):
    @blp.arguments(SeedRequestSchema)
    @blp.response(200, SeedReportSchema, description="Nothing new was created (already seeded)")
    @blp.alt_response(201, schema=SeedReportSchema, description="Something was created")
    @blp.alt_response(202, schema=SeedQueuedSchema, description="With `Prefer: respond-async`: seed.org queued")
    @internal_access
    @blp.idempotent
    def post(self, data):
        """Seed an organization: org, admin user and the 15 platform artifacts (idempotent).

        The body is checked field by field (400 names `org.mainDomain`, `admin.email`, …). The org id
        is the lower-cased `mainDomain`. A second call creates nothing and answers 200 with every
        artifact `existing`; another `product` provisions that product for the same org (201).
        With `Prefer: respond-async` the `seed.org` task is queued instead (202, follow `statusUrl`)."""
        if wants_async():
            # a leased job through the outbox like every other 202: it survives a broker outage, a lost
            # worker and the task time limit (app.ops.seed_jobs)
            task_id = queue_seed(db.session, data)  # sent once the request's unit of work commits
            org_id, product = org_id_for(data["org"]["mainDomain"]), data["org"]["product"]
            url = f"/internal/seed/{org_id}?product={product}"
            return accepted({"taskId": task_id, "orgId": org_id, "product": product, "status": "queued",
                             "statusUrl": url}, url, respond_async=True)
        report = seed_org(data)
        return report, 201 if report["created"] else 200


@blp.route("/seed/<string:orgId>")
class SeedStatus(MethodView):
    @blp.arguments(SeedStatusQuerySchema, location="query")
    @blp.response(200, SeedStatusSchema)
    @internal_access
    def get(self, args, orgId):
        """What the org holds in `product` (default product when omitted): every registry artifact,
        `existing` (with the org's version and forkedFromVersion) or `missing`; and `lastRequest`, the
        org's latest asynchronous seed (queued, running, done or failed with its `error`)."""
        org_id, product = orgId.lower(), args.get("product") or current_app.config["DEFAULT_PRODUCT"]
        last = latest_request(org_id, product)
        try:
            return {**seed_status(org_id, product), "lastRequest": last}
        except NotFound:
            if last is None:
                raise
            # an accepted seed that has not created the org yet: the 202's status URL answers, with the request
            return {"orgId": org_id, "product": product, "artifacts": [], "summary": {}, "lastRequest": last}

