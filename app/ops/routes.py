"""Operations: /health (cluster-internal, no token) and /api/v1/me (who am I); `blueprints` adds
/internal (app.ops.internal) and the artifact registry's administration (app.ops.admin)."""

from __future__ import annotations

from flask.views import MethodView

from app.extensions import Blueprint as ApiBlueprint
from app.ops import admin, internal
from app.ops.schemas import HealthSchema, IdentitySchema
from app.ops.services import health_report
from app.tenancy import current_tenant

health_blp = ApiBlueprint("health", __name__, description="Health of this backend service (no token)")
blp = ApiBlueprint("ops", __name__, url_prefix="/api/v1", description="Identity and operations")
blueprints = [health_blp, blp, internal.blp, admin.blp]  # registered in this order (app.DOMAINS)


@health_blp.route("/health")
class Health(MethodView):
    @health_blp.response(200, HealthSchema, description="every configured check passed")
    @health_blp.alt_response(503, schema=HealthSchema, description="`degraded`: the failing check says why")
    @health_blp.doc(security=[])
    def get(self):
        """Health of this backend: database, Redis (when configured), blob storage. Reached inside the
        cluster (not through the gateway), without a token; 503 names the failing check."""
        report, healthy = health_report()
        return report, 200 if healthy else 503


@blp.route("/me")
class Me(MethodView):
    @blp.response(200, IdentitySchema)
    def get(self):
        """The caller's verified identity (from the token's claims)."""
        return current_tenant().as_dict()
