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

from app.extensions import Blueprint
from app.fields import NulFree, QueryInt
from app.ops import rollout as registry
from app.tenancy import current_tenant
from app.wire import accepted

blp = Blueprint("admin_artifacts", __name__, url_prefix="/api/v1/admin/artifacts",
                description="Platform artifact registry and rollouts (role admin or super_admin)")
ADMIN = ("admin", "super_admin")


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
        """The registry: every platform artifact with its current definition and artifactVersion."""
        return {"artifacts": [registry.artifact_to_wire(a) for a in registry.list_artifacts()]}

    @blp.arguments(PublishQuerySchema, location="query")
    @blp.arguments(registry.PublishSchema)
    @blp.response(202, PublishedSchema)
    @blp.requires(roles=ADMIN)
    @blp.idempotent
    def post(self, query, data):
        """Publish `{kind, name, artifactVersion, definition}` (version above the current one, else 409)
        and start rolling it out to every org (`seed.rollout`). `?rollout=false` only publishes."""
        artifact, started = registry.publish(data, created_by=current_tenant().user_id, rollout=query["rollout"])
        return accepted({"artifact": registry.artifact_to_wire(artifact),
                         "rollout": registry.rollout_to_wire(started) if started else None})


@blp.route("/rollouts")
class Rollouts(MethodView):
    @blp.response(200, RolloutListSchema)
    @blp.requires(roles=ADMIN)
    def get(self):
        """The 50 most recent rollouts with their progress."""
        return {"rollouts": [registry.rollout_to_wire(r) for r in registry.list_rollouts()]}


@blp.route("/rollouts/<string:rolloutId>")
class RolloutById(MethodView):
    @blp.arguments(OutcomeQuerySchema, location="query")
    @blp.response(200, RolloutDetailSchema)
    @blp.requires(roles=ADMIN)
    def get(self, args, rolloutId):
        """Progress and per-org outcomes (optionally one `outcome`, e.g. forked), paged by `after`."""
        rollout = registry.get_rollout(rolloutId)
        outcomes = registry.rollout_outcomes(rolloutId, args.get("outcome"), args.get("after"), args["limit"])
        cursor = f"{outcomes[-1].org_id}/{outcomes[-1].product}" if len(outcomes) == args["limit"] else None
        return {"rollout": registry.rollout_to_wire(rollout),
                "outcomes": [registry.outcome_to_wire(o) for o in outcomes], "nextCursor": cursor}


@blp.route("/rollouts/<string:rolloutId>/resume")
class RolloutResume(MethodView):
    @blp.response(202, RolloutSchema)
    @blp.requires(roles=ADMIN)
    def post(self, rolloutId):
        """Continue a rollout that stopped (failed, or its worker was lost) from its cursor."""
        return accepted(registry.rollout_to_wire(registry.resume(rolloutId)))


