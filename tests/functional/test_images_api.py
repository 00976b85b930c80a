"""POST /api/v1/agents/images through HTTP, against fake provider upstreams on loopback.

The fakes check every request like the real APIs would (tests/images_fakes.py); each test ends by
asserting they saw no protocol violation.
"""

from __future__ import annotations

import io
import os
import re
import time
from datetime import UTC, datetime

import pytest
from PIL import Image
from sqlalchemy import select

from app.db import db
from app.images.fetcher import REFUSED_MESSAGE, ReferenceFetcher, public_address_allowed
from app.images.models import ImageUsage
from app.registry import find_service, override_service, registry_of
from app.storage.local import LocalBlobStore
from tests.images_fakes import (
    RESOLUTION_CASES,
    TEXT_CASES,
    TRANSFER_CASES,
    FakeAzureImages,
    FakeImagen,
    LoopbackNet,
    Reply,
    TlsImageServer,
    b64,
    jpeg_bytes,
    mask_bytes,
    png_bytes,
    service_account_file,
)
from tests.support import assert_error

URL = "/api/v1/agents/images"
SCOPE = "write:image-gen"
REF_HOSTS = ["cdn.example.com", "internal.example.com", "rebind.example.com"]


class Fakes:
    def __init__(self) -> None:
        self.a = FakeAzureImages()
        self.b = FakeImagen()
        self.tls = TlsImageServer()
        self.net = LoopbackNet(self.tls.port)

    def reset(self) -> None:
        self.a.reset()
        self.b.reset()
        self.net.lookups.clear()
        self.net.connections.clear()
        self.net.answers.clear()
        self.net.answers.update({"cdn.example.com": ["127.0.0.1"], "internal.example.com": ["10.0.0.5"],
                                 "rebind.example.com": ["127.0.0.1"]})

    def upstream_requests(self) -> int:
        return len(self.a.received) + len(self.b.received)


@pytest.fixture(scope="module")
def fakes():
    f = Fakes()
    yield f
    f.a.close()
    f.b.close()
    f.tls.close()


@pytest.fixture(scope="module")
def configured(app, fakes):
    """The session app pointed at the fakes (restored afterwards)."""
    settings = {
        "PROVIDER_A_ENDPOINT": fakes.a.url, "PROVIDER_A_API_KEY": FakeAzureImages.API_KEY,
        "PROVIDER_A_API_VERSION": FakeAzureImages.GENERATION_VERSION,
        "PROVIDER_A_EDIT_API_VERSION": FakeAzureImages.EDIT_VERSION,
        "PROVIDER_A_LEGACY_DEPLOYMENTS": "legacy-images",
        "PROVIDER_B_ENDPOINT": fakes.b.url, "PROVIDER_B_PROJECT": FakeImagen.PROJECT,
        "PROVIDER_B_LOCATION": FakeImagen.LOCATION, "PROVIDER_B_ACCESS_TOKEN": FakeImagen.STATIC_TOKEN,
        "PROVIDER_B_CREDENTIALS": "", "IMAGE_REF_ALLOWED_HOSTS": ",".join(REF_HOSTS),
    }
    saved = {k: app.config.get(k) for k in settings}
    app.config.update(settings)
    registry_of(app).drop("image_provider")

    def loopback_fetcher(config):
        from app.storage import get_blob_store

        return ReferenceFetcher([get_blob_store().public_host, *REF_HOSTS], resolver=fakes.net.resolve,
                                connector=fakes.net.connect, address_allowed=LoopbackNet.policy,
                                ssl_context=fakes.tls.client_context())

    with override_service(app, "image_fetcher", loopback_fetcher):
        yield app
    app.config.update(saved)
    registry_of(app).drop("image_provider")


@pytest.fixture(autouse=True)
def clean(configured, fakes):
    fakes.reset()
    yield
    assert fakes.a.violations == [] and fakes.b.violations == []


@pytest.fixture()
def post(client, auth):
    def call(body, scopes=(SCOPE,), **kwargs):
        return client.post(URL, json=body, headers=auth(*scopes, **kwargs))

    return call


def ok(resp):
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["metadata"]["success"] is True and isinstance(body["metadata"]["timestamp"], int)
    return body["data"]


def error(resp, status, code):
    return assert_error(resp, status, code)["error"]


def blob_path(url: str) -> str:
    assert url.startswith("http://gateway.test/blobs/"), url
    return url[len("http://gateway.test"):]


GENERAL = {"provider": "provider-a", "model": "gpt-image-1", "prompt": "a red fox in snow"}
LEGACY = {"provider": "provider-a", "model": "legacy-images", "prompt": "a red fox in snow"}
IMAGEN = {"provider": "provider-b", "model": "imagen-3.0-generate-002", "prompt": "a red fox in snow"}
EDIT_B = {"provider": "provider-b", "model": "imagen-3.0-capability-001", "prompt": "make [1] blue"}


# -- generate ------------------------------------------------------------------------------------

def test_provider_a_general_generate_stores_and_serves_the_image(post, client, fakes, org_id):
    data = ok(post(GENERAL | {"size": "1536x1024", "quality": "high"}))
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    assert re.fullmatch(rf"http://gateway\.test/blobs/platform-images/images/{org_id}/{day}/[0-9a-f-]{{36}}\.png",
                        data["url"])
    assert data | {"url": None} == {
        "url": None, "mimeType": "image/png", "bytes": len(fakes.a.image), "width": 96, "height": 64,
        "revisedPrompt": "a revised prompt", "provider": "provider-a", "model": "gpt-image-1", "mode": "generate",
        "usage": {"inputTokens": 50, "outputTokens": 4160, "totalTokens": 4210}}
    (sent,) = fakes.a.received
    assert sent.path == "/openai/deployments/gpt-image-1/images/generations"
    assert sent.query["api-version"] == [FakeAzureImages.GENERATION_VERSION]
    assert sent.json == {"prompt": "a red fox in snow", "n": 1, "size": "1536x1024", "quality": "high",
                         "output_format": "png"}
    served = client.get(blob_path(data["url"]))  # no token needed
    assert served.status_code == 200 and served.data == fakes.a.image
    with Image.open(io.BytesIO(served.data)) as decoded:
        assert decoded.size == (96, 64) and decoded.format == "PNG"
    assert served.headers["Content-Type"] == "image/png"
    assert "public" in served.headers["Cache-Control"]


def test_prompt_of_exactly_4000_characters_is_accepted(post, fakes):
    ok(post(GENERAL | {"prompt": "x" * 4000}))
    assert fakes.a.received[0].json["prompt"] == "x" * 4000


def test_provider_a_legacy_generate_honours_style_and_reports_no_usage(post, fakes):
    data = ok(post(LEGACY | {"size": "1792x1024", "quality": "hd", "style": "natural"}))
    assert "usage" not in data and data["model"] == "legacy-images"
    assert fakes.a.received[0].json == {"prompt": "a red fox in snow", "n": 1, "size": "1792x1024",
                                        "quality": "hd", "style": "natural", "response_format": "b64_json"}


def test_legacy_family_is_guessed_from_a_dall_e_name(post, fakes):
    ok(post(LEGACY | {"model": "dall-e-3", "style": "vivid"}))
    assert fakes.a.received[0].json["response_format"] == "b64_json"


def test_provider_a_general_ignores_style_and_negative_prompt(post, fakes, caplog):
    with caplog.at_level("WARNING", logger="app.images.providers.provider_a"):
        ok(post(GENERAL | {"style": "vivid", "negativePrompt": "no people"}))
    assert "style" not in fakes.a.received[0].json and "negativePrompt" not in fakes.a.received[0].json
    assert any("ignores negativePrompt" in r.getMessage() for r in caplog.records)


def test_provider_b_generate_maps_pixel_size_and_passes_negative_prompt(post, client, fakes):
    data = ok(post(IMAGEN | {"size": "1408x768", "negativePrompt": "blurry", "quality": "hd", "style": "vivid"}))
    assert data["mimeType"] == "image/jpeg" and data["url"].endswith(".jpg")
    assert (data["width"], data["height"], data["mode"]) == (80, 60, "generate")
    assert "usage" not in data and "revisedPrompt" not in data
    (sent,) = fakes.b.received
    assert sent.path == (f"/v1/projects/{FakeImagen.PROJECT}/locations/{FakeImagen.LOCATION}"
                         "/publishers/google/models/imagen-3.0-generate-002:predict")
    assert sent.headers["Authorization"] == f"Bearer {FakeImagen.STATIC_TOKEN}"
    assert sent.json == {"instances": [{"prompt": "a red fox in snow"}],
                         "parameters": {"sampleCount": 1, "aspectRatio": "16:9", "negativePrompt": "blurry",
                                        "outputOptions": {"mimeType": "image/png"}}}
    served = client.get(blob_path(data["url"]))
    assert served.data == fakes.b.image and served.headers["Content-Type"] == "image/jpeg"


@pytest.mark.parametrize("size,ratio", [("1:1", "1:1"), ("9:16", "9:16"), ("4:3", "4:3"), ("768x1408", "9:16"),
                                        ("1024x1024", "1:1"), ("1200x900", "4:3")])
def test_provider_b_aspect_ratios(post, fakes, size, ratio):
    ok(post(IMAGEN | {"size": size}))
    assert fakes.b.received[0].json["parameters"]["aspectRatio"] == ratio


def test_provider_b_sample_image_size_only_for_models_that_take_it(post, fakes):
    ok(post(IMAGEN | {"model": "imagen-4.0-generate-001", "size": "2048x1152"}))
    assert fakes.b.received[0].json["parameters"]["sampleImageSize"] == "2K"


def test_provider_b_service_account_token_is_minted_once_and_reused(app, post, fakes, tmp_path):
    from app.images.providers.provider_b import ImagenProvider

    config = dict(app.config, PROVIDER_B_ACCESS_TOKEN="",
                  PROVIDER_B_CREDENTIALS=service_account_file(f"{fakes.b.url}/token"))
    with override_service(app, "image_provider", lambda _config, name: ImagenProvider.from_config(config)):
        ok(post(IMAGEN))
        ok(post(IMAGEN))
    os.unlink(config["PROVIDER_B_CREDENTIALS"])
    assert fakes.b.issued_tokens == ["sa-token-1"]
    predicts = [r for r in fakes.b.received if r.path.endswith(":predict")]
    assert [r.headers["Authorization"] for r in predicts] == ["Bearer sa-token-1"] * 2


def test_provider_b_token_rejected_is_503_and_the_next_call_mints_a_new_one(app, post, fakes):
    from app.images.providers.provider_b import ImagenProvider

    config = dict(app.config, PROVIDER_B_ACCESS_TOKEN="",
                  PROVIDER_B_CREDENTIALS=service_account_file(f"{fakes.b.url}/token"))
    with override_service(app, "image_provider", lambda _config, name: ImagenProvider.from_config(config)):
        ok(post(IMAGEN))
        fakes.b.reply(Reply(401, {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "expired"}}))
        err = error(post(IMAGEN), 503, "SERVICE_UNAVAILABLE")
        ok(post(IMAGEN))
    os.unlink(config["PROVIDER_B_CREDENTIALS"])
    assert err["details"] == {"provider": "provider-b", "upstreamStatus": 401}
    assert fakes.b.issued_tokens == ["sa-token-1", "sa-token-2"]


def test_usage_line_is_recorded_per_call(app, post, fakes, org_id):
    ok(post(GENERAL))
    fakes.a.reply(Reply(429, {"error": {"code": "429", "message": "slow down"}}, {"Retry-After": "3"}))
    error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    error(post(GENERAL | {"prompt": ""}), 400, "INVALID_INPUT")  # rejected before the provider: not usage
    with app.app_context():
        rows = db.session.scalars(select(ImageUsage).where(ImageUsage.org_id == org_id)
                                  .order_by(ImageUsage.created_at)).all()
    assert [(r.outcome, r.http_status) for r in rows] == [("success", 200), ("SERVICE_UNAVAILABLE", 503)]
    first = rows[0]
    assert (first.service, first.provider, first.model, first.mode, first.user_id) == (
        "image-generation", "provider-a", "gpt-image-1", "generate", "user-1")
    assert (first.input_tokens, first.output_tokens, first.total_tokens) == (50, 4160, 4210)
    assert first.latency_ms >= 0 and first.image_bytes == len(fakes.a.image) and first.cost is None


# -- edit ----------------------------------------------------------------------------------------

def test_provider_a_edit_with_reference_and_mask_b64(post, fakes):
    reference, mask = png_bytes(64, 48), mask_bytes(64, 48)
    data = ok(post(GENERAL | {"prompt": "add a hat", "size": "1024x1024", "quality": "low",
                              "referenceImage": {"b64": b64(reference), "mimeType": "image/png"},
                              "mask": {"b64": b64(mask)}}))
    assert data["mode"] == "edit" and data["usage"]["totalTokens"] == 4210
    (sent,) = fakes.a.received
    assert sent.path == "/openai/deployments/gpt-image-1/images/edits"
    assert sent.query["api-version"] == [FakeAzureImages.EDIT_VERSION]
    assert sent.parts["image"] == (reference, "image/png")
    assert sent.parts["mask"] == (mask, "image/png")
    assert {k: v[0].decode() for k, v in sent.parts.items() if k not in ("image", "mask")} == {
        "prompt": "add a hat", "n": "1", "size": "1024x1024", "quality": "low"}


def test_provider_a_edit_with_jpeg_reference(post, fakes):
    reference = jpeg_bytes(64, 48)
    ok(post(GENERAL | {"referenceImage": {"b64": b64(reference), "mimeType": "image/jpeg"}}))
    assert fakes.a.received[0].parts["image"] == (reference, "image/jpeg")


def test_edit_with_reference_url_of_our_own_blob_reads_storage(post, fakes):
    first = ok(post(GENERAL))
    fakes.reset()
    mask = mask_bytes(96, 64)  # the generated image is 96x64
    data = ok(post(GENERAL | {"prompt": "now at night", "mask": {"b64": b64(mask)},
                              "referenceImage": {"url": first["url"], "mimeType": "image/png"}}))
    assert data["mode"] == "edit"
    (sent,) = fakes.a.received
    assert sent.parts["image"][0] == fakes.a.image and sent.parts["mask"][0] == mask
    assert fakes.net.lookups == [] and fakes.net.connections == []  # never over HTTP


def test_own_blob_mask_url_and_size_check_after_loading(post, fakes):
    stored_mask = ok(post(GENERAL))  # a 96x64 RGBA PNG from the fake: has alpha
    reference = png_bytes(64, 48)
    err = error(post(GENERAL | {"referenceImage": {"b64": b64(reference), "mimeType": "image/png"},
                                "mask": {"url": stored_mask["url"]}}), 400, "VALIDATION_ERROR")
    assert "96x64" in err["message"] and "64x48" in err["message"]


def test_missing_own_blob_is_refused_uniformly(post, fakes, org_id):
    url = f"http://gateway.test/blobs/platform-images/images/{org_id}/2026-01-01/nope.png"
    err = error(post(EDIT_B | {"referenceImage": {"url": url, "mimeType": "image/png"}}), 400, "VALIDATION_ERROR")
    assert err["message"] == REFUSED_MESSAGE and fakes.upstream_requests() == 0


def test_provider_b_edit_inlines_the_reference(post, fakes):
    reference = jpeg_bytes(40, 40)
    data = ok(post(EDIT_B | {"referenceImage": {"b64": b64(reference), "mimeType": "image/jpeg"}}))
    assert data["mode"] == "edit"
    instance = fakes.b.received[0].json["instances"][0]
    assert instance["referenceImages"] == [{"referenceType": "REFERENCE_TYPE_RAW", "referenceId": 1,
                                            "referenceImage": {"bytesBase64Encoded": b64(reference)}}]


def test_provider_b_edit_with_an_allowed_external_url(post, fakes):
    data = ok(post(EDIT_B | {"referenceImage": {"url": "https://cdn.example.com/ok.png", "mimeType": "image/png"}}))
    assert data["mode"] == "edit"
    ref = fakes.b.received[0].json["instances"][0]["referenceImages"][0]["referenceImage"]
    assert ref["bytesBase64Encoded"] == b64(fakes.tls.png)
    assert fakes.net.connections == [("127.0.0.1", 443)]


def test_provider_a_edit_with_external_reference_and_mask_urls(post, fakes):
    ok(post(GENERAL | {"referenceImage": {"url": "https://cdn.example.com/ok.png", "mimeType": "image/png"},
                       "mask": {"url": "https://cdn.example.com/mask.png"}}))
    sent = fakes.a.received[0]
    assert sent.parts["image"][0] == fakes.tls.png and sent.parts["mask"][0] == fakes.tls.mask


# -- validation, in its fixed order (the first failure answers) ------------------------------------

REF_PNG = {"b64": b64(png_bytes(64, 48)), "mimeType": "image/png"}
MASK = {"b64": b64(mask_bytes(64, 48))}

INVALID_INPUT_CASES = {
    "rule1-missing-provider": {k: v for k, v in GENERAL.items() if k != "provider"},
    "rule1-unknown-provider": GENERAL | {"provider": "provider-c"},
    "rule1-wrong-case": GENERAL | {"provider": "Provider-A"},
    "rule2-missing-model": {k: v for k, v in GENERAL.items() if k != "model"},
    "rule2-empty-model": GENERAL | {"model": ""},
    "rule2-blank-model": GENERAL | {"model": "   "},
    "rule2-model-with-path": GENERAL | {"model": "../../admin"},
    "rule3-missing-prompt": {k: v for k, v in GENERAL.items() if k != "prompt"},
    "rule3-empty-prompt": GENERAL | {"prompt": ""},
    "rule3-blank-prompt": GENERAL | {"prompt": " \n\t "},
    "rule3-long-prompt": GENERAL | {"prompt": "x" * 4001},
    "rule4-ref-both": GENERAL | {"referenceImage": {"url": "https://cdn.example.com/ok.png", "b64": "AAAA",
                                                    "mimeType": "image/png"}},
    "rule4-ref-neither": GENERAL | {"referenceImage": {"mimeType": "image/png"}},
    "rule4-ref-no-mime": GENERAL | {"referenceImage": {"b64": REF_PNG["b64"]}},
    "rule4-ref-gif": GENERAL | {"referenceImage": {"b64": REF_PNG["b64"], "mimeType": "image/gif"}},
    "rule4-mask-both": GENERAL | {"referenceImage": REF_PNG, "mask": {"url": "https://x.example.com/m.png",
                                                                      "b64": MASK["b64"]}},
    "rule4-mask-neither": GENERAL | {"referenceImage": REF_PNG, "mask": {}},
    "type-prompt-number": GENERAL | {"prompt": 123},
    "type-reference-string": GENERAL | {"referenceImage": "https://cdn.example.com/ok.png"},
    "type-mask-list": GENERAL | {"referenceImage": REF_PNG, "mask": ["x"]},
    "unknown-field": GENERAL | {"n": 2},
    "unknown-nested-field": GENERAL | {"referenceImage": REF_PNG | {"detail": "high"}},
    "general-size": GENERAL | {"size": "1792x1024"},
    "general-quality": GENERAL | {"quality": "hd"},
    "legacy-size": LEGACY | {"size": "auto"},
    "legacy-quality": LEGACY | {"quality": "high"},
    "legacy-style": LEGACY | {"style": "bright"},
    "imagen-size-ratio": IMAGEN | {"size": "2:1"},
    "imagen-size-text": IMAGEN | {"size": "large"},
    "imagen-size-huge": IMAGEN | {"size": "20000x100"},
    "order-1-before-5": GENERAL | {"provider": "nope", "mask": MASK},
    "order-3-before-6": IMAGEN | {"prompt": "", "referenceImage": REF_PNG, "mask": MASK},
    "order-4-before-5": GENERAL | {"referenceImage": {"mimeType": "image/png"}, "mask": MASK},
}

VALIDATION_ERROR_CASES = {
    "rule5-mask-without-reference": GENERAL | {"mask": MASK},
    "rule6-mask-with-provider-b": EDIT_B | {"referenceImage": REF_PNG, "mask": MASK},
    "legacy-rejects-reference": LEGACY | {"referenceImage": REF_PNG},
    "rule7-mask-jpeg": GENERAL | {"referenceImage": REF_PNG, "mask": {"b64": b64(jpeg_bytes(64, 48))}},
    "rule7-mask-without-alpha": GENERAL | {"referenceImage": REF_PNG,
                                           "mask": {"b64": b64(png_bytes(64, 48, mode="RGB"))}},
    "rule7-mask-other-size": GENERAL | {"referenceImage": REF_PNG, "mask": {"b64": b64(mask_bytes(32, 32))}},
    "rule7-mask-bad-base64": GENERAL | {"referenceImage": REF_PNG, "mask": {"b64": "not base64!"}},
    "rule7-mask-not-image": GENERAL | {"referenceImage": REF_PNG, "mask": {"b64": b64(b"\x89PNG\r\n\x1a\nrubbish")}},
    "ref-bad-base64": GENERAL | {"referenceImage": {"b64": "%%%%", "mimeType": "image/png"}},
    "ref-data-url": GENERAL | {"referenceImage": {"b64": "data:image/png;base64," + REF_PNG["b64"],
                                                  "mimeType": "image/png"}},
    "ref-html-bytes": GENERAL | {"referenceImage": {"b64": b64(b"<html></html>"), "mimeType": "image/png"}},
    "ref-mime-mismatch": GENERAL | {"referenceImage": {"b64": REF_PNG["b64"], "mimeType": "image/jpeg"}},
    "ref-too-large": GENERAL | {"referenceImage": {"b64": "A" * (28 * 1024 * 1024), "mimeType": "image/png"}},
    "rule8-http": EDIT_B | {"referenceImage": {"url": "http://cdn.example.com/ok.png", "mimeType": "image/png"}},
    "rule8-host": EDIT_B | {"referenceImage": {"url": "https://elsewhere.example.net/a.png", "mimeType": "image/png"}},
    "order-5-before-size": GENERAL | {"mask": MASK, "size": "999x999"},
    "order-8-before-size": IMAGEN | {"referenceImage": {"url": "https://evil.example.net/a.png",
                                                        "mimeType": "image/png"}, "size": "2:1"},
}


@pytest.mark.parametrize("case", sorted(INVALID_INPUT_CASES))
def test_invalid_input_before_any_upstream_call(post, fakes, case):
    err = error(post(INVALID_INPUT_CASES[case]), 400, "INVALID_INPUT")
    assert fakes.upstream_requests() == 0
    if case.startswith("type-"):
        assert set(err["details"]["fields"]) == {case.split("-")[1].replace("reference", "referenceImage")}
    if case.startswith(("general-", "legacy-", "imagen-")):
        assert err["details"]["accepted"] and err["details"]["field"] in {"size", "quality", "style"}


@pytest.mark.parametrize("case", sorted(VALIDATION_ERROR_CASES))
def test_validation_error_before_any_upstream_call(post, fakes, case):
    error(post(VALIDATION_ERROR_CASES[case]), 400, "VALIDATION_ERROR")
    assert fakes.upstream_requests() == 0 and fakes.net.connections == []


def test_size_error_lists_the_accepted_values(post):
    err = error(post(GENERAL | {"size": "1792x1024"}), 400, "INVALID_INPUT")
    assert err["details"] == {"field": "size", "accepted": ["1024x1024", "1536x1024", "1024x1536", "auto"]}
    assert "1536x1024" in err["message"]


def test_body_that_is_not_an_object_is_invalid_input(client, auth):
    error(client.post(URL, json=["x"], headers=auth(SCOPE)), 400, "INVALID_INPUT")
    error(client.post(URL, data="{", headers=auth(SCOPE) | {"Content-Type": "application/json"}),
          400, "INVALID_INPUT")


def test_scope_is_required(post, fakes):
    error(post(GENERAL, scopes=("read:agents",)), 403, "FORBIDDEN")
    ok(post(GENERAL, scopes=("write",)))  # the generic write scope covers write:image-gen


def test_token_is_required(client):
    error(client.post(URL, json=GENERAL), 401, "UNAUTHORIZED")


# -- error mapping -------------------------------------------------------------------------------

@pytest.fixture()
def reconfigure(app, monkeypatch):
    """reconfigure(KEY=value, ...): change settings for one test; providers are rebuilt from them."""

    def apply(**settings):
        for key, value in settings.items():
            monkeypatch.setitem(app.config, key, value)
        registry_of(app).drop("image_provider")

    yield apply
    registry_of(app).drop("image_provider")  # rebuilt lazily from the restored settings


def test_unconfigured_provider_is_503(post, fakes, reconfigure):
    reconfigure(PROVIDER_A_API_KEY="")
    err = error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    assert err["details"]["provider"] == "provider-a" and fakes.upstream_requests() == 0


@pytest.mark.parametrize("headers,seconds", [({"Retry-After": "7"}, 7), ({"retry-after-ms": "2500"}, 3)])
def test_rate_limit_is_503_with_retry_hint_and_no_retry(post, fakes, headers, seconds):
    fakes.a.reply(Reply(429, {"error": {"code": "429", "message": "Rate limit exceeded"}}, headers))
    resp = post(GENERAL)
    err = error(resp, 503, "SERVICE_UNAVAILABLE")
    assert err["details"]["retryAfterSeconds"] == seconds and err["details"]["upstreamStatus"] == 429
    assert resp.headers["Retry-After"] == str(seconds)
    assert len(fakes.a.received) == 1


def test_provider_b_resource_exhausted_is_503(post, fakes):
    fakes.b.reply(Reply(429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Quota"}}))
    err = error(post(IMAGEN), 503, "SERVICE_UNAVAILABLE")
    assert err["details"]["retryable"] is True and err["details"]["retryAfterSeconds"] > 0


def test_5xx_is_retried_once_then_503(post, fakes):
    fakes.a.reply(Reply(500, {"error": {"code": "InternalServerError", "message": "boom"}}),
                  Reply(502, {"error": {"code": "BadGateway", "message": "boom"}}))
    err = error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    assert err["details"]["upstreamStatus"] == 502 and "retryAfterSeconds" in err["details"]
    assert len(fakes.a.received) == 2


def test_5xx_then_success_returns_the_image(post, fakes):
    fakes.b.reply(Reply(503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "later"}}))
    ok(post(IMAGEN))
    assert len(fakes.b.received) == 2


def test_connection_failure_is_retried_once(post, fakes):
    fakes.a.reply(Reply(drop_connection=True))
    ok(post(GENERAL))
    assert len(fakes.a.received) == 2


def test_unreachable_provider_is_503(post, fakes, reconfigure):
    import socket

    with socket.socket() as probe:  # a port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reconfigure(PROVIDER_A_ENDPOINT=f"http://127.0.0.1:{port}")
    err = error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    assert err["details"]["provider"] == "provider-a" and err["details"]["retryable"] is True


def test_no_retry_when_the_budget_has_no_room(app, post, fakes, monkeypatch):
    monkeypatch.setitem(app.config, "IMAGE_TIMEOUT_SECONDS", 1.2)
    fakes.a.reply(Reply(500, {"error": {"code": "InternalServerError", "message": "boom"}}))
    error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    assert len(fakes.a.received) == 1


def test_slow_upstream_is_504_within_the_budget(app, post, fakes, monkeypatch):
    monkeypatch.setitem(app.config, "IMAGE_TIMEOUT_SECONDS", 1)
    fakes.b.reply(Reply(200, {"predictions": []}, delay=3))
    started = time.monotonic()
    err = error(post(IMAGEN), 504, "TIMEOUT")
    assert time.monotonic() - started < 2.5
    assert err["details"]["provider"] == "provider-b"


@pytest.mark.parametrize("code,inner", [("content_policy_violation", "ResponsibleAIPolicyViolation"),
                                        ("contentFilter", None), ("moderation_blocked", None)])
def test_content_policy_is_invalid_input_with_the_provider_message(post, fakes, code, inner):
    error_body = {"code": code, "message": f"Blocked by policy ({code})."}
    if inner:
        error_body["inner_error"] = {"code": inner}
    fakes.a.reply(Reply(400, {"error": error_body}))
    err = error(post(GENERAL), 400, "INVALID_INPUT")
    assert err["message"] == f"Blocked by policy ({code})."
    assert err["details"]["reason"] == "content_policy" and len(fakes.a.received) == 1


def test_unknown_deployment_is_invalid_input(post):
    err = error(post(GENERAL | {"model": "no-such-deployment"}), 400, "INVALID_INPUT")
    assert "no-such-deployment" in err["message"] and err["details"]["upstreamCode"] == "DeploymentNotFound"


def test_unknown_imagen_model_is_invalid_input(post):
    err = error(post(IMAGEN | {"model": "imagen-9"}), 400, "INVALID_INPUT")
    assert "imagen-9" in err["message"] and err["details"]["upstreamStatus"] == 404


def test_imagen_invalid_argument_is_passed_on(post, fakes):
    fakes.b.reply(Reply(400, {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                        "message": "Negative prompt is not supported for this model."}}))
    err = error(post(IMAGEN | {"negativePrompt": "x"}), 400, "INVALID_INPUT")
    assert err["message"] == "Negative prompt is not supported for this model."


@pytest.mark.parametrize("body,reason", [
    ({"predictions": [{"raiFilteredReason": "Your prompt was blocked (code 58061214)."}]},
     "Your prompt was blocked (code 58061214)."),
    ({"predictions": []}, None), ({}, None)])
def test_imagen_safety_filtering_is_invalid_input(post, fakes, body, reason):
    fakes.b.reply(Reply(200, body))
    err = error(post(IMAGEN), 400, "INVALID_INPUT")
    assert err["details"]["reason"] == "content_policy"
    if reason:
        assert err["message"] == reason


def test_rejected_credentials_are_503(post, fakes):
    fakes.a.reply(Reply(401, {"error": {"code": "401", "message": "Access denied due to invalid key"}}))
    err = error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")
    assert "invalid key" not in err["message"]


def test_upstream_bytes_that_are_not_an_image_are_503(post, fakes):
    fakes.a.reply(Reply(200, {"data": [{"b64_json": b64(b"<html>oops</html>")}]}))
    error(post(GENERAL), 503, "SERVICE_UNAVAILABLE")


def test_blob_store_failure_is_500(app, post, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    with override_service(app, "blob_store", lambda _config: LocalBlobStore(
            str(blocker / "blobs"), "platform-images", "http://gateway.test/blobs/platform-images")):
        err = error(post(GENERAL), 500, "SYSTEM_ERROR")
    assert err["message"] == "Storing the generated image failed."


# -- SSRF through the API: every case, one uniform answer ----------------------------------------

SSRF_URLS = ([("text", u) for u in TEXT_CASES if u]
             + [("resolve", case) for case in sorted(RESOLUTION_CASES)]
             + [("transfer", p) for p in TRANSFER_CASES])


@pytest.mark.parametrize("kind,value", SSRF_URLS)
def test_ssrf_payloads_get_one_uniform_refusal(app, post, fakes, monkeypatch, kind, value):
    if kind == "resolve":
        # the production policy: here not even the loopback test server may be contacted
        monkeypatch.setattr(fetcher_of(app), "address_allowed", public_address_allowed)
        fakes.net.answers["rebind.example.com"] = RESOLUTION_CASES[value]
        url = "https://rebind.example.com/ok.png"
    elif kind == "transfer":
        url = f"https://cdn.example.com{value}"
    else:
        url = value
    resp = post(EDIT_B | {"referenceImage": {"url": url, "mimeType": "image/png"}})
    assert resp.status_code == 400
    assert resp.get_json()["error"] == {"code": "VALIDATION_ERROR", "message": REFUSED_MESSAGE,
                                        "details": {"field": "referenceImage.url"}}
    assert fakes.upstream_requests() == 0
    assert all(address == "127.0.0.1" for address, _ in fakes.net.connections)
    if kind == "resolve":
        assert fakes.net.connections == []


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_slow_drip_reference_is_refused(app, post, fakes, monkeypatch, path):
    fetcher = fetcher_of(app)
    monkeypatch.setattr(fetcher, "deadline_seconds", 1.0)  # the 10 s rule, scaled down
    resp = post(EDIT_B | {"referenceImage": {"url": f"https://cdn.example.com{path}", "mimeType": "image/png"}})
    assert resp.get_json()["error"]["message"] == REFUSED_MESSAGE and fakes.upstream_requests() == 0


def fetcher_of(app):
    with app.app_context():
        return find_service("image_fetcher")


# -- the gcs backend end to end ------------------------------------------------------------------

@pytest.fixture()
def gcs_backend(app):
    from app.storage import build_blob_store
    from tests.images_fakes import GcsEmulator

    emulator = GcsEmulator()
    store = build_blob_store(dict(app.config, BLOB_BACKEND="gcs", BLOB_PUBLIC_BASE_URL="",
                                  GCS_ENDPOINT=emulator.endpoint))
    with override_service(app, "blob_store", lambda _config: store):
        yield store
    emulator.close()


def test_gcs_backend_stores_serves_and_reads_back_own_urls(post, fakes, gcs_backend, org_id):
    import requests

    data = ok(post(GENERAL))
    assert data["url"].startswith(f"{gcs_backend.public_base_url}/images/{org_id}/")
    served = requests.get(data["url"], timeout=10)
    assert served.status_code == 200 and served.content == fakes.a.image
    fakes.reset()
    ok(post(EDIT_B | {"referenceImage": {"url": data["url"], "mimeType": "image/png"}}))
    ref = fakes.b.received[0].json["instances"][0]["referenceImages"][0]["referenceImage"]
    assert ref["bytesBase64Encoded"] == b64(fakes.a.image)
    assert fakes.net.connections == []  # read through the storage API, not fetched
