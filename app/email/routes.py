"""Email: POST /api/v1/email/send (scope write:notifications)."""

from __future__ import annotations

from flask.views import MethodView

from app.auth import require_scopes
from app.email.schemas import SendEmailRequestSchema, SendEmailResponseSchema
from app.email.services import send_email
from app.extensions import Blueprint
from app.ratelimit import rate_limited
from app.tenancy import current_tenant

blp = Blueprint("email", __name__, url_prefix="/api/v1/email", description="Outbound email")


@blp.route("/send")
class SendEmail(MethodView):
    @blp.arguments(SendEmailRequestSchema)
    @blp.response(200, SendEmailResponseSchema)
    @require_scopes("write:notifications")
    @rate_limited("email")
    def post(self, payload):
        """Send one pre-rendered email. Check `success`: delivery failures answer 200 with success false."""
        result = send_email(payload["to"], payload["subject"], payload["body"], current_tenant())
        return {"success": result.success, "message": result.message}
