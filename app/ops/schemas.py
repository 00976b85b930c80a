"""Wire shapes of the operations routes."""

from marshmallow import Schema, fields, validate

from app.extensions import ExactDumpSchema
from app.fields import NulFree


class IdentitySchema(ExactDumpSchema):
    orgId = fields.String(required=True)
    userId = fields.String(required=True)
    email = fields.String(allow_none=True)
    role = fields.String(allow_none=True)
    scopes = fields.List(fields.String(), required=True)
    product = fields.String(required=True)


class HealthCheckSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(("ok", "fail")))
    latencyMs = fields.Float(metadata={"description": "when ok"})
    error = fields.String(metadata={"description": "when fail: the exception, at most 300 characters"})


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(("ok", "degraded")))
    checks = fields.Dict(keys=fields.String(), values=fields.Nested(HealthCheckSchema), required=True,
                         metadata={"description": "database, redis (when configured), blobStorage"})


class SeedAdminReportSchema(Schema):
    id = fields.String(required=True)
    email = fields.String(required=True)
    firstName = fields.String()
    lastName = fields.String()
    role = fields.String()
    created = fields.Boolean(metadata={"description": "false when the user already existed"})


class SeedArtifactLineSchema(Schema):
    id = fields.String(required=True, metadata={"description": "registry id, e.g. agent.assistant"})
    kind = fields.String(required=True, metadata={"description": "database, storage, entity, skill, agent"})
    name = fields.String(required=True)
    objectId = fields.String(allow_none=True, metadata={"description": "the org's object (agent id, …)"})
    artifactVersion = fields.Integer(required=True)
    forkedFromVersion = fields.Integer()
    status = fields.String(required=True, metadata={
        "description": "created, existing, conflict (seeding) or missing (status)"})
    detail = fields.String()


class SeedSummarySchema(Schema):
    total = fields.Integer()
    created = fields.Integer()
    existing = fields.Integer()
    conflict = fields.Integer()


class SeedReportSchema(Schema):
    orgId = fields.String(required=True)
    title = fields.String()
    mainDomain = fields.String()
    product = fields.String(required=True)
    schema = fields.String(metadata={"description": "the product's database schema"})
    orgCreated = fields.Boolean()
    created = fields.Boolean(required=True, metadata={"description": "false: the call created nothing"})
    admin = fields.Nested(SeedAdminReportSchema, required=True)
    artifacts = fields.List(fields.Nested(SeedArtifactLineSchema), required=True)
    summary = fields.Nested(SeedSummarySchema)


class SeedQueuedSchema(Schema):
    taskId = fields.String(required=True)
    orgId = fields.String(required=True)
    product = fields.String(required=True)
    status = fields.String(required=True)
    statusUrl = fields.String(required=True)


class SeedStatusQuerySchema(NulFree):
    product = fields.String(validate=validate.Regexp(r"^[a-z][a-z0-9_]{0,39}$"))


class SeedRequestStateSchema(Schema):
    id = fields.String(required=True)
    status = fields.String(required=True, metadata={"description": "queued, running, done, failed"})
    error = fields.String(allow_none=True, metadata={
        "description": "why it failed: the seeding refused the body, or its runs were interrupted (worker "
                       "lost, task time limit) JOB_MAX_ATTEMPTS times"})
    attempts = fields.Integer(metadata={"description": "runs started"})
    createdAt = fields.String()
    finishedAt = fields.String(allow_none=True)


class SeedStatusSchema(Schema):
    orgId = fields.String(required=True)
    title = fields.String()
    mainDomain = fields.String()
    product = fields.String(required=True)
    artifacts = fields.List(fields.Nested(SeedArtifactLineSchema), required=True)
    summary = fields.Dict(keys=fields.String(), values=fields.Integer())
    lastRequest = fields.Nested(SeedRequestStateSchema, allow_none=True, metadata={
        "description": "the org's latest asynchronous seed (`Prefer: respond-async`) in this product; null if "
                       "none. Until that seed has created the org, the answer holds only the request (no artifacts)"})


# The request example of POST /internal/seed: the example organization example.com (RFC 2606 reserves
# the name) in the default product. Run as is it seeds that one organization, nothing platform-wide.
SEED_EXAMPLE = {"org": {"title": "Example Org", "mainDomain": "example.com", "product": "default"},
                "admin": {"email": "admin@example.com", "firstName": "Ada", "lastName": "Example"}}
