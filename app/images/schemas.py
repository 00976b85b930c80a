"""Wire shapes of image generation: ImageRequest, ImageResult and the success envelope.

The request schema checks types only. The validation rules (which fields are required, which values
are allowed, in which order, and which code each failure gets) run in `services`, so every
field is optional here; a wrongly typed or unknown field is a bad request (400 INVALID_INPUT).
"""

from __future__ import annotations

from marshmallow import RAISE, Schema, ValidationError, fields

from app.errors import InvalidInput
from app.images.providers import provider_ids


class _StrictSchema(Schema):
    class Meta:
        unknown = RAISE


class ReferenceImageSchema(_StrictSchema):
    url = fields.String(metadata={"description": "https URL on an allowed host (own blob storage by default)"})
    b64 = fields.String(metadata={"description": "standard base64 of the PNG/JPEG bytes (no data: prefix)"})
    mimeType = fields.String(metadata={"enum": ["image/png", "image/jpeg"]})


class MaskSchema(_StrictSchema):
    url = fields.String()
    b64 = fields.String()


class ImageRequestSchema(_StrictSchema):
    def handle_error(self, error: ValidationError, data, *, many: bool, **kwargs):
        """Type errors and unknown fields are a bad request (INVALID_INPUT), not a rule failure."""
        raise InvalidInput("Malformed image request.", {"fields": error.messages, "location": "json"})

    provider = fields.String(metadata={"enum": provider_ids(), "description": "required"})
    model = fields.String(metadata={"description": "required; provider-native deployment id or model name"})
    prompt = fields.String(metadata={"description": "required; 1-4000 characters"})
    size = fields.String(metadata={"description": "depends on provider/model (see the provider table)"})
    quality = fields.String(metadata={"description": "low|medium|high|auto (provider-a general), "
                                                     "standard|hd (provider-a legacy); ignored by provider-b"})
    style = fields.String(metadata={"description": "vivid|natural; provider-a legacy model only"})
    negativePrompt = fields.String(metadata={"description": "honored only by provider-b"})
    referenceImage = fields.Nested(ReferenceImageSchema, metadata={"description": "edit mode"})
    mask = fields.Nested(MaskSchema, metadata={"description": "PNG with alpha, same size as the reference; "
                                                              "provider-a general model only"})


class UsageSchema(Schema):
    inputTokens = fields.Integer(required=True)
    outputTokens = fields.Integer(required=True)
    totalTokens = fields.Integer(required=True)


class ImageResultSchema(Schema):
    url = fields.String(required=True)
    mimeType = fields.String(required=True, metadata={"enum": ["image/png", "image/jpeg"]})
    bytes = fields.Integer(required=True)
    width = fields.Integer()
    height = fields.Integer()
    revisedPrompt = fields.String()
    provider = fields.String(required=True)
    model = fields.String(required=True)
    mode = fields.String(required=True, metadata={"enum": ["generate", "edit"]})
    usage = fields.Nested(UsageSchema)


class SuccessMetadataSchema(Schema):
    success = fields.Boolean(required=True, metadata={"example": True})
    timestamp = fields.Integer(required=True, metadata={"description": "unix seconds"})


class ImageResponseSchema(Schema):
    data = fields.Nested(ImageResultSchema, required=True)
    metadata = fields.Nested(SuccessMetadataSchema, required=True)


# The request example (OpenAPI): one generated image of provider-a's general model.
IMAGE_EXAMPLE = {"provider": "provider-a", "model": "gpt-image-1", "prompt": "a lighthouse at dawn, watercolor",
                 "size": "1024x1024", "quality": "medium"}
