"""POST /internal/seed: cluster-internal organization seeding.

Authenticated like every route (app.auth): header `X-Internal-Token` equal to INTERNAL_API_TOKEN
(constant-time; with no token configured that path is closed), or a Bearer token with role admin or
super_admin (the role itself: scope `*` does not stand in for it here).
"""

from __future__ import annotations

from flask import current_app
from flask.views import MethodView

from app.errors import NotFound
from app.extensions import Blueprint, db, path_param
from app.ops.schemas import SEED_EXAMPLE, SeedQueuedSchema, SeedReportSchema, SeedStatusQuerySchema, SeedStatusSchema
from app.ops.seed_jobs import latest_request, queue_seed
from app.ops.seeding import SeedRequestSchema, org_id_for, seed_org, seed_status
from app.wire import accepted, wants_async

blp = Blueprint("internal", __name__, url_prefix="/internal", tag="Organization seeding",
                description="Cluster-internal seeding of organizations (X-Internal-Token or an admin token)")
ADMIN_ROLES = ("admin", "super_admin")
internal_access = blp.requires(roles=ADMIN_ROLES, star_bypasses=False, internal_token=True)


@blp.route("/seed")
class Seed(MethodView):
    @blp.arguments(SeedRequestSchema, example=SEED_EXAMPLE)
    @blp.response(200, SeedReportSchema, description="Nothing new was created (already seeded)")
    @blp.alt_response(201, schema=SeedReportSchema, description="Something was created")
    @blp.alt_response(202, schema=SeedQueuedSchema, description="With `Prefer: respond-async`: seed.org queued")
    @internal_access
    @blp.idempotent
    def post(self, data):
        """Seed an organization

        Creates the organization, its admin user and the 15 platform artifacts (databases, storage,
        entities, skills, agents) in `org.product`, and answers what it created. The org id is the
        lower-cased `mainDomain`. Idempotent: a second call creates nothing and answers 200 with every
        artifact `existing`; another `product` provisions that product for the same org (201). With
        `Prefer: respond-async` the `seed.org` task is queued instead (202; follow `statusUrl`).
        Accepts the `X-Internal-Token` header (INTERNAL_API_TOKEN) or a token with role admin or
        super_admin.

        Errors: 400 VALIDATION_ERROR naming the field (`org.mainDomain` must be a domain name,
        `admin.email` an address, `org.product` a product slug); 401/403 without an accepted credential.

        Example: the request example seeds the example organization `example.com` (title "Example
        Org", admin admin@example.com) in the default product: 201 the first time, 200 after that. It
        touches only that organization."""
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


@blp.route("/seed/<string:orgId>", parameters=[path_param(
    "orgId", "The organization's id: the lower-cased `mainDomain` it was seeded with.", "example.com")])
class SeedStatus(MethodView):
    @blp.arguments(SeedStatusQuerySchema, location="query")
    @blp.response(200, SeedStatusSchema)
    @internal_access
    def get(self, args, orgId):
        """Seeding status of an organization

        What the org holds in `product` (the default product when omitted): every registry artifact,
        `existing` (with the org's version and forkedFromVersion) or `missing`; and `lastRequest`, the
        org's latest asynchronous seed (queued, running, done, or failed with its `error`). Before an
        accepted asynchronous seed has created the org, the answer holds only `lastRequest`.

        Errors: 404 NOT_FOUND for an org that was never seeded (and has no queued seed); 400 for a
        malformed `product`.

        Example: `GET /internal/seed/example.com?product=default` → `{"orgId": "example.com", "artifacts":
        [{"id": "database.product-schema", "status": "existing", …}, …], "summary": {"total": 15,
        "existing": 15, "missing": 0}, "lastRequest": null}`"""
        org_id, product = orgId.lower(), args.get("product") or current_app.config["DEFAULT_PRODUCT"]
        last = latest_request(org_id, product)
        try:
            return {**seed_status(org_id, product), "lastRequest": last}
        except NotFound:
            if last is None:
                raise
            # an accepted seed that has not created the org yet: the 202's status URL answers, with the request
            return {"orgId": org_id, "product": product, "artifacts": [], "summary": {}, "lastRequest": last}

