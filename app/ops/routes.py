"""Operations: /health (cluster-internal, no token) and /api/v1/me (who am I)."""

from __future__ import annotations

from flask import Blueprint, jsonify
from flask.views import MethodView

from app.extensions import Blueprint as ApiBlueprint
from app.ops.schemas import IdentitySchema
from app.ops.services import health_report
from app.tenancy import current_tenant

health_bp = Blueprint("health", __name__)
blp = ApiBlueprint("ops", __name__, url_prefix="/api/v1", description="Identity and operations")


@health_bp.get("/health")
def health():
    """Health of this backend: database, Redis (when configured), blob storage. 503 names the failure."""
    report, healthy = health_report()
    return jsonify(report), 200 if healthy else 503


@blp.route("/me")
class Me(MethodView):
    @blp.response(200, IdentitySchema)
    def get(self):
        """The caller's verified identity (from the token's claims)."""
        return current_tenant().as_dict()
