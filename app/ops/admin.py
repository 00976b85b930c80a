"""Platform administration of the artifact registry (role admin or super_admin):

- GET  /api/v1/admin/artifacts                       the registry (current definition and version)
- POST /api/v1/admin/artifacts                       publish a version → 202 with the started rollout
- GET  /api/v1/admin/artifacts/rollouts              recent rollouts with progress
- GET  /api/v1/admin/artifacts/rollouts/{rolloutId}  progress + per-org outcomes (filter, page by cursor)
- POST /api/v1/admin/artifacts/rollouts/{rolloutId}/resume   continue a stopped rollout
"""

from __future__ import annotations

from flask.views import MethodView
from marshmallow import Schema, fields, validate

from app.extensions import Blueprint, ErrorEnvelopeSchema, path_param
from app.fields import NulFree, QueryInt
from app.ops import rollout as registry
from app.tenancy import current_tenant
from app.wire import accepted

blp = Blueprint("admin_artifacts", __name__, url_prefix="/api/v1/admin/artifacts", tag="Artifact registry",
                description="Platform artifact registry and rollouts (role admin or super_admin)")
ADMIN = ("admin", "super_admin")
# The request example of publishing: the built-in storage artifact at the version every release ships
# (1). Publishing needs a version above the current one, so as is it is refused (409, currentVersion in
# the details) and changes nothing; a reader raises artifactVersion to publish. No example publishes.
PUBLISH_EXAMPLE = {"kind": "storage", "name": "org-files", "artifactVersion": 1, "definition": {"prefix": "orgs"}}
ROLLOUT_ID = path_param("rolloutId", "A rollout's `id`: from the answer of a publish, or the rollout list.")


class ArtifactSchema(Schema):
    id = fields.String(required=True, metadata={"example": "agent.assistant"})
    kind = fields.String(required=True, validate=validate.OneOf(("database", "storage", "entity", "skill", "agent")))
    name = fields.String(required=True)
    artifactVersion = fields.Integer(required=True)
    definition = fields.Dict(required=True, metadata={"description": "the body the kind's own API accepts"})
    updatedAt = fields.String(allow_none=True)


class PublishQuerySchema(Schema):
    rollout = fields.Boolean(load_default=True, metadata={"description": "false: only publish, start no rollout"})


class ArtifactListSchema(Schema):
    artifacts = fields.List(fields.Nested(ArtifactSchema), required=True)


class RolloutSchema(Schema):
    id = fields.String(required=True)
    artifactId = fields.String(required=True)
    kind = fields.String()
    name = fields.String()
    artifactVersion = fields.Integer(required=True)
    status = fields.String(required=True, metadata={"description": "pending, running, done, failed, superseded"})
    total = fields.Integer(metadata={"description": "org/product pairs when the rollout started"})
    processed = fields.Integer()
    counts = fields.Dict(keys=fields.String(), values=fields.Integer(),
                         metadata={"description": "updated, forked, added, current, missing, failed"})
    error = fields.String(allow_none=True)
    createdBy = fields.String(allow_none=True)
    createdAt = fields.String()
    updatedAt = fields.String()
    finishedAt = fields.String(allow_none=True)


class PublishedSchema(Schema):
    artifact = fields.Nested(ArtifactSchema, required=True)
    rollout = fields.Nested(RolloutSchema, allow_none=True)


class RolloutListSchema(Schema):
    rollouts = fields.List(fields.Nested(RolloutSchema), required=True)


class OutcomeSchema(Schema):
    orgId = fields.String(required=True)
    product = fields.String(required=True)
    outcome = fields.String(required=True)
    detail = fields.String(allow_none=True)
    at = fields.String()


class RolloutDetailSchema(Schema):
    rollout = fields.Nested(RolloutSchema, required=True)
    outcomes = fields.List(fields.Nested(OutcomeSchema), required=True)
    nextCursor = fields.String(allow_none=True, metadata={"description": "pass as `after` for the next page"})


class OutcomeQuerySchema(NulFree):
    outcome = fields.String(validate=validate.OneOf(registry.OUTCOMES))
    after = fields.String(validate=validate.Length(max=200), metadata={"description": "orgId/product"})
    limit = QueryInt(load_default=100, validate=validate.Range(min=1, max=1000))


@blp.route("")
class Artifacts(MethodView):
    @blp.response(200, ArtifactListSchema)
    @blp.requires(roles=ADMIN)
    def get(self):
        """List platform artifacts

        The registry: every platform artifact (the 15 built-ins and any published since) with its
        current definition and artifactVersion, in seeding order.

        Errors: 403 FORBIDDEN without role admin or super_admin.

        Example: `GET /api/v1/admin/artifacts` → `{"artifacts": [{"id": "database.product-schema",
        "kind": "database", "name": "product-schema", "artifactVersion": 1, "definition": {}, …}, …]}`"""
        return {"artifacts": [registry.artifact_to_wire(a) for a in registry.list_artifacts()]}

    @blp.arguments(PublishQuerySchema, location="query")
    @blp.arguments(registry.PublishSchema, example=PUBLISH_EXAMPLE)
    @blp.response(202, PublishedSchema)
    @blp.alt_response(409, schema=ErrorEnvelopeSchema,
                      description="CONFLICT: `artifactVersion` is not above the current one (`details.currentVersion`)")
    @blp.requires(roles=ADMIN)
    @blp.idempotent
    def post(self, query, data):
        """Publish an artifact version

        Stores `{kind, name, artifactVersion, definition}` as the platform's current version of the
        artifact (a new name adds an artifact) and starts rolling it out to every organization of every
        product (`seed.rollout` on the seed queue): orgs that still hold the previous version get the new
        one, orgs that changed their copy are reported `forked` and keep it. `?rollout=false` only
        publishes; later seeds and a later rollout use it. This changes every organization: publish
        from a reviewed file (`flask artifacts publish FILE` does the same from the command line).

        Errors: 409 CONFLICT when `artifactVersion` is not above the current version
        (`details.currentVersion`); 400 VALIDATION_ERROR when `definition` is not a valid body of the
        kind (its `name` must equal `name`, an agent's skills must exist in the registry).

        Example: the request example republishes the built-in `storage.org-files` at version 1, the
        version it already has, so as is it answers 409 with `currentVersion` and changes nothing. To
        publish, set `artifactVersion` to `currentVersion + 1` (and `rollout=false` to roll out later)."""
        artifact, started = registry.publish(data, created_by=current_tenant().user_id, rollout=query["rollout"])
        return accepted({"artifact": registry.artifact_to_wire(artifact),
                         "rollout": registry.rollout_to_wire(started) if started else None})


@blp.route("/rollouts")
class Rollouts(MethodView):
    @blp.response(200, RolloutListSchema)
    @blp.requires(roles=ADMIN)
    def get(self):
        """List recent rollouts

        The 50 most recent rollouts, newest first, each with its status (pending, running, done, failed,
        superseded), the org/product pairs it covers and its counts per outcome.

        Errors: 403 FORBIDDEN without role admin or super_admin.

        Example: `GET /api/v1/admin/artifacts/rollouts` → `{"rollouts": [{"id": "…", "artifactId":
        "agent.assistant", "artifactVersion": 2, "status": "done", "total": 12, "processed": 12,
        "counts": {"updated": 11, "forked": 1, …}, …}]}`"""
        return {"rollouts": [registry.rollout_to_wire(r) for r in registry.list_rollouts()]}


@blp.route("/rollouts/<string:rolloutId>", parameters=[ROLLOUT_ID])
class RolloutById(MethodView):
    @blp.arguments(OutcomeQuerySchema, location="query")
    @blp.response(200, RolloutDetailSchema)
    @blp.requires(roles=ADMIN)
    def get(self, args, rolloutId):
        """A rollout and its outcomes

        The rollout's progress and its per-org outcomes (updated, forked, added, current, missing,
        failed), by org id; `outcome` keeps one kind (e.g. `forked`: the orgs that kept their own
        copy); `nextCursor` goes back as `after` for the next page.

        Errors: 404 NOT_FOUND for an unknown rollout id; 400 for an unknown `outcome` or a `limit` out
        of 1–1000.

        Example: `GET /api/v1/admin/artifacts/rollouts/{rolloutId}?outcome=forked&limit=100` →
        `{"rollout": {…}, "outcomes": [{"orgId": "acme.com", "product": "default", "outcome": "forked",
        …}], "nextCursor": null}`"""
        rollout = registry.get_rollout(rolloutId)
        outcomes = registry.rollout_outcomes(rolloutId, args.get("outcome"), args.get("after"), args["limit"])
        cursor = f"{outcomes[-1].org_id}/{outcomes[-1].product}" if len(outcomes) == args["limit"] else None
        return {"rollout": registry.rollout_to_wire(rollout),
                "outcomes": [registry.outcome_to_wire(o) for o in outcomes], "nextCursor": cursor}


@blp.route("/rollouts/<string:rolloutId>/resume", parameters=[ROLLOUT_ID])
class RolloutResume(MethodView):
    @blp.response(202, RolloutSchema)
    @blp.requires(roles=ADMIN)
    def post(self, rolloutId):
        """Resume a stopped rollout

        Continues a rollout that stopped (`failed`, or its worker was lost) from the last org it
        finished; the orgs done before are not visited again. A rollout that is `done` or `superseded`
        (a later version was published) is answered as it is, unchanged.

        Errors: 404 NOT_FOUND for an unknown rollout id.

        Example: `POST /api/v1/admin/artifacts/rollouts/{rolloutId}/resume` → 202 `{"id": "…",
        "status": "pending", "processed": 40, "total": 120, …}`"""
        return accepted(registry.rollout_to_wire(registry.resume(rolloutId)))


