"""POST /api/v1/agents/images: one image per call, stored in blob storage, public URL returned."""

from __future__ import annotations

from flask.views import MethodView

from app.extensions import Blueprint, ErrorEnvelopeSchema
from app.images.schemas import IMAGE_EXAMPLE, ImageRequestSchema, ImageResponseSchema
from app.images.services import generate_image
from app.ratelimit import rate_limited
from app.tenancy import current_tenant
from app.wire import success_envelope

blp = Blueprint("images", __name__, url_prefix="/api/v1/agents", tag="Image generation",
                description="Image generation and editing through the configured providers")


@blp.route("/images")
class Images(MethodView):
    @blp.arguments(ImageRequestSchema, example=IMAGE_EXAMPLE)
    @blp.response(200, ImageResponseSchema)
    @blp.alt_response(400, schema=ErrorEnvelopeSchema,
                      description="INVALID_INPUT (a missing or malformed provider, model or prompt; a "
                                  "size or quality the model does not take; the provider's refusal) or "
                                  "VALIDATION_ERROR (mask rules, a refused reference URL, bad image bytes)")
    @blp.alt_response(403, schema=ErrorEnvelopeSchema, description="token lacks scope write:image-gen")
    @blp.alt_response(500, schema=ErrorEnvelopeSchema, description="SYSTEM_ERROR: storing the image failed")
    @blp.alt_response(503, schema=ErrorEnvelopeSchema,
                      description="provider not configured, upstream 5xx or rate limiting (retry hint in details)")
    @blp.alt_response(504, schema=ErrorEnvelopeSchema, description="the image call exceeded its budget (120 s)")
    @blp.requires("write:image-gen")
    @rate_limited("images")
    @blp.idempotent
    def post(self, payload):
        """Generate or edit an image

        Generates one image from `prompt` with the named `provider` and `model`, or edits
        `referenceImage` (a URL of our own storage or an allowed host, or inline base64), optionally
        with a `mask` (a PNG whose transparent pixels are repainted). The image is stored in blob
        storage and its public URL answered with its size and token usage. Synchronous: the call
        returns when the image is stored (up to 120 seconds).

        The request is checked in this order, the first failure answering: provider, model and prompt
        present (1–4000 characters); `referenceImage` and `mask` each with exactly one of `url`/`b64`
        and a PNG/JPEG `mimeType`; a mask only with a reference and a provider that takes masks;
        inline bytes that decode to an image (the mask the reference's size); URLs on an allowed host;
        then the options the model takes (`size`, `quality`, `style`).

        Errors: 400 INVALID_INPUT or VALIDATION_ERROR as above; 503 SERVICE_UNAVAILABLE when the
        provider is not configured or answers 5xx/429 (`details.retryAfterSeconds`, `Retry-After`);
        504 TIMEOUT; 500 SYSTEM_ERROR when storing failed; 429 RATE_LIMITED for the organization's
        image limit.

        Example: the request example generates a 1024×1024 watercolor lighthouse with provider-a's
        `gpt-image-1` → `{"data": {"url": "https://…/images/…png", "mimeType": "image/png", "width": 1024,
        "height": 1024, "provider": "provider-a", "model": "gpt-image-1", "mode": "generate", "usage":
        {…}}, "metadata": {"success": true, "timestamp": 1795341600}}`"""
        result = generate_image(payload, current_tenant())
        return success_envelope(result)
