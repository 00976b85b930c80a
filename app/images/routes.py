"""POST /api/v1/agents/images: one image per call, stored in blob storage, public URL returned."""

from __future__ import annotations

from flask.views import MethodView

from app.extensions import Blueprint, ErrorEnvelopeSchema
from app.images.schemas import ImageRequestSchema, ImageResponseSchema
from app.images.services import generate_image
from app.ratelimit import rate_limited
from app.tenancy import current_tenant
from app.wire import success_envelope

blp = Blueprint("images", __name__, url_prefix="/api/v1/agents", description="Image generation")


@blp.route("/images")
class Images(MethodView):
    @blp.arguments(ImageRequestSchema)
    @blp.response(200, ImageResponseSchema)
    @blp.alt_response(400, schema=ErrorEnvelopeSchema,
                      description="INVALID_INPUT (rules 1-4, size/quality, upstream refusal) or "
                                  "VALIDATION_ERROR (rules 5-8, refused URL, bad reference bytes)")
    @blp.alt_response(403, schema=ErrorEnvelopeSchema, description="token lacks scope write:image-gen")
    @blp.alt_response(500, schema=ErrorEnvelopeSchema, description="SYSTEM_ERROR: storing the image failed")
    @blp.alt_response(503, schema=ErrorEnvelopeSchema,
                      description="provider not configured, upstream 5xx or rate limiting (retry hint in details)")
    @blp.alt_response(504, schema=ErrorEnvelopeSchema, description="the image call exceeded its budget (120 s)")
    @blp.requires("write:image-gen")
    @rate_limited("images")
    @blp.idempotent
    def post(self, payload):
        """Generate one image (or edit a reference image, optionally with a mask) and store it.

        Synchronous: the call returns when the image is stored (up to 120 seconds).
        """
        result = generate_image(payload, current_tenant())
        return success_envelope(result)
