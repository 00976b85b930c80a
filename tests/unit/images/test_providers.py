"""Pure pieces of the adapters: size mapping, family detection, retry hints, image inspection."""

from __future__ import annotations

import email.utils
import time

import pytest

from app.errors import GatewayTimeout, InvalidInput, ValidationFailed
from app.images.imaging import NotAnImage, inspect_image
from app.images.providers import mask_refusal, provider_class, provider_ids
from app.images.providers.base import Budget, ImageJob, retry_after_seconds
from app.images.providers.provider_a import AzureImagesProvider
from app.images.providers.provider_b import ImagenProvider, TokenSource, aspect_for_size
from app.images.schemas import ImageRequestSchema
from app.images.services import _check_basics
from tests.images_fakes import jpeg_bytes, mask_bytes, png_bytes


@pytest.mark.parametrize("size,expected", [
    (None, ("1:1", None)), ("16:9", ("16:9", None)), ("1408x768", ("16:9", 1408)), ("768x1408", ("9:16", 1408)),
    ("1024x1024", ("1:1", 1024)), ("896x1280", ("3:4", 1280)), ("1280x896", ("4:3", 1280)),
    ("3000x100", ("16:9", 3000)),
])
def test_aspect_for_size(size, expected):
    assert aspect_for_size(size) == expected


@pytest.mark.parametrize("size", ["2:1", "0x100", "100x0", "1024 x 1024", "-5x5", "9000x9000", "", "1:1 "])
def test_aspect_for_size_rejects(size):
    with pytest.raises(ValueError):
        aspect_for_size(size)


def _azure(legacy=("corp-legacy",)):
    return AzureImagesProvider("https://x.openai.azure.com", "k", "v1", "v2", list(legacy))


@pytest.mark.parametrize("deployment,family", [("corp-legacy", "legacy"), ("CORP-LEGACY", "legacy"),
                                               ("my-dall-e-3", "legacy"), ("dalle3", "legacy"),
                                               ("gpt-image-1", "general"), ("images-prod", "general")])
def test_provider_a_family_from_config_then_name(deployment, family):
    assert _azure().family(deployment).key == family


def test_provider_a_legacy_rejects_reference_and_general_accepts_it():
    with pytest.raises(ValidationFailed):
        _azure().check_capabilities("corp-legacy", reference=True, mask=False)
    _azure().check_capabilities("gpt-image-1", reference=True, mask=True)


def test_the_registry_words_the_spec_rules_as_before():
    """The accepted ids, the mask rule (6) and the family refusal come from what the adapters declare;
    their wording is the API's (clients and the fakes' tests read it)."""
    assert provider_ids() == ["provider-a", "provider-b"]
    assert ImageRequestSchema().fields["provider"].metadata["enum"] == ["provider-a", "provider-b"]
    assert provider_class("provider-a") is AzureImagesProvider and provider_class("provider-b") is ImagenProvider
    assert AzureImagesProvider.takes_mask() and not ImagenProvider.takes_mask()
    with pytest.raises(InvalidInput) as unknown:
        _check_basics({"provider": "provider-c", "model": "m", "prompt": "p"})
    assert (unknown.value.message, unknown.value.details) == ("provider must be one of: provider-a, provider-b.",
                                                              {"field": "provider"})
    refusal = mask_refusal()
    assert (refusal.message, refusal.details) == ("mask is supported only by provider-a (general model).",
                                                  {"field": "mask"})
    with pytest.raises(ValidationFailed) as legacy:
        _azure().check_capabilities("corp-legacy", reference=False, mask=True)
    assert legacy.value.message == ("The provider-a legacy model does not support reference images or masks; "
                                    "use the provider-a general model or provider-b.")
    assert legacy.value.details == {"field": "referenceImage", "model": "corp-legacy"}


def test_provider_b_ignores_quality_and_style():
    provider = ImagenProvider("", "p", "us-central1", TokenSource(access_token="t"))
    provider.check_options(ImageJob(model="imagen-3.0-generate-002", prompt="x", quality="hd", style="vivid"))
    with pytest.raises(InvalidInput):
        provider.check_options(ImageJob(model="imagen-3.0-generate-002", prompt="x", size="5:4"))
    assert provider.base_url == "https://us-central1-aiplatform.googleapis.com"


def test_provider_configured_flags():
    assert not AzureImagesProvider("", "", "v", "v", []).configured
    assert not ImagenProvider("", "", "us-central1", TokenSource()).configured
    assert ImagenProvider("", "p", "us-central1", TokenSource(credentials_path="/sa.json")).configured


def test_retry_after_forms():
    assert retry_after_seconds({"Retry-After": "12"}) == 12
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 2
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after_seconds({"Retry-After": future}) <= 31
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_budget_expiry_is_a_504():
    clock = iter([0.0, 5.0]).__next__
    budget = Budget(2, clock=clock)
    with pytest.raises(GatewayTimeout):
        budget.require("x")


def test_inspect_image_reads_type_size_and_alpha():
    png = inspect_image(mask_bytes(30, 20))
    assert (png.mime_type, png.width, png.height, png.has_alpha) == ("image/png", 30, 20, True)
    jpg = inspect_image(jpeg_bytes(10, 12))
    assert (jpg.mime_type, jpg.extension, jpg.has_alpha) == ("image/jpeg", "jpg", False)
    assert inspect_image(png_bytes(5, 5, mode="RGB")).has_alpha is False


@pytest.mark.parametrize("data", [b"", b"GIF89a....", b"\x89PNG\r\n\x1a\n" + b"\0" * 50, jpeg_bytes()[:40]])
def test_inspect_image_rejects_non_images(data):
    with pytest.raises(NotAnImage):
        inspect_image(data)


def test_inspect_image_pixel_cap(monkeypatch):
    monkeypatch.setattr("app.images.imaging.MAX_PIXELS", 100)
    with pytest.raises(NotAnImage):
        inspect_image(png_bytes(20, 20))
