"""Operations: /health (cluster-internal, no token) and /api/v1/me (who am I); `blueprints` adds
/internal (app.ops.internal) and the artifact registry's administration (app.ops.admin)."""

from __future__ import annotations

from flask.views import MethodView

from app.extensions import Blueprint as ApiBlueprint
from app.ops import admin, internal
from app.ops.schemas import HealthSchema, IdentitySchema
from app.ops.services import health_report
from app.tenancy import current_tenant

# the health operations ignore query parameters: a probe (a load balancer's, a monitor's cache buster) is
# not an API client, and a 400 there would take a healthy node out of rotation
health_blp = ApiBlueprint("health", __name__, tag="Health", description="Health of this backend service (no token)",
                          refuse_unknown_query=False)
blp = ApiBlueprint("ops", __name__, url_prefix="/api/v1", tag="Identity",
                   description="Who the caller is, as the token says")
blueprints = [health_blp, blp, internal.blp, admin.blp]  # registered in this order (app.DOMAINS)


@health_blp.route("/health")
class Health(MethodView):
    @health_blp.response(200, HealthSchema, description="every configured check passed")
    @health_blp.alt_response(503, schema=HealthSchema, description="`degraded`: the failing check says why")
    @health_blp.doc(security=[])
    def get(self):
        """Health of this backend

        Checks the database, Redis (when REDIS_URL is configured) and blob storage, each with its
        latency. Called from inside the cluster (load balancer, orchestrator probes), not through the
        gateway, and without a token.

        Errors: 503 with `status: degraded` when a check fails; the failing check carries `error`.

        Example: `GET /health` → `{"status": "ok", "checks": {"database": {"status": "ok", "latencyMs": 1.2},
        "redis": {"status": "ok", "latencyMs": 0.4}, "blobStorage": {"status": "ok", "latencyMs": 0.3}}}`"""
        report, healthy = health_report()
        return report, 200 if healthy else 503


@blp.route("/me")
class Me(MethodView):
    @blp.response(200, IdentitySchema)
    def get(self):
        """The caller's identity

        The verified claims of the bearer token: organization, user, email, role, scopes and product
        (the deployment's default product when the token names none). Any valid token may call it.

        Errors: 401 UNAUTHORIZED for a missing, invalid or expired token.

        Example: `GET /api/v1/me` → `{"orgId": "acme", "userId": "user-1", "email": "ada@example.com",
        "role": "admin", "scopes": ["read", "write"], "product": "default"}`"""
        return current_tenant().as_dict()
