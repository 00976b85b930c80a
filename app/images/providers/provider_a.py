"""provider-a: Azure OpenAI Images on deployment routes.

Generate is JSON on `/openai/deployments/{deployment}/images/generations`; edit (general family
only) is multipart on `/images/edits` with its own api-version. Auth is the `api-key` header. The
deployment in the path names the model, so the body never carries `model`.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any
from urllib.parse import quote

from app.config import csv_setting
from app.errors import InvalidInput
from app.images.providers.base import (
    Budget,
    ImageJob,
    ImageProvider,
    ModelFamily,
    ProviderImage,
    UpstreamClient,
    UpstreamResponse,
    register,
    reject_option,
    service_error,
    unavailable,
    upstream_error,
)

log = logging.getLogger(__name__)

NAME = "provider-a"
# the general family (gpt-image) edits, with or without a mask; the legacy one (dall-e-3) only generates
GENERAL = ModelFamily("general", "the provider-a general model", edit=True, mask=True)
LEGACY = ModelFamily("legacy", "the provider-a legacy model", edit=False, mask=False)
SIZES = {GENERAL: ["1024x1024", "1536x1024", "1024x1536", "auto"],
         LEGACY: ["1024x1024", "1792x1024", "1024x1792"]}
QUALITIES = {GENERAL: ["low", "medium", "high", "auto"], LEGACY: ["standard", "hd"]}
STYLES = ["vivid", "natural"]
CONTENT_POLICY_CODES = {"contentfilter", "content_filter", "content_policy_violation", "moderation_blocked",
                        "responsibleaipolicyviolation"}


@register
class AzureImagesProvider(ImageProvider):
    id = NAME
    families = (GENERAL, LEGACY)

    def __init__(self, endpoint: str, api_key: str, api_version: str, edit_api_version: str,
                 legacy_deployments: list[str], client: UpstreamClient | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.api_key = api_key
        self.api_version = api_version
        self.edit_api_version = edit_api_version
        self.legacy_deployments = {d.lower() for d in legacy_deployments}
        self.client = client or UpstreamClient(NAME, self.endpoint)

    @classmethod
    def from_config(cls, config) -> AzureImagesProvider:
        return cls(config["PROVIDER_A_ENDPOINT"], config["PROVIDER_A_API_KEY"], config["PROVIDER_A_API_VERSION"],
                   config["PROVIDER_A_EDIT_API_VERSION"], csv_setting(config["PROVIDER_A_LEGACY_DEPLOYMENTS"]))

    @property
    def configured(self) -> bool:
        return bool(self.endpoint and self.api_key)

    def family(self, deployment: str) -> ModelFamily:
        """Operator config first; a deployment named like dall-e is legacy; everything else general."""
        name = deployment.lower()
        if name in self.legacy_deployments or "dall-e" in name or "dalle" in name:
            return LEGACY
        return GENERAL

    # -- validation -----------------------------------------------------------------------------

    def check_options(self, job: ImageJob) -> None:
        family = self.family(job.model)
        if job.size is not None and job.size not in SIZES[family]:
            reject_option("size", job.size, SIZES[family], family.wording)
        if job.quality is not None and job.quality not in QUALITIES[family]:
            reject_option("quality", job.quality, QUALITIES[family], family.wording)
        if family == LEGACY and job.style is not None and job.style not in STYLES:
            reject_option("style", job.style, STYLES, family.wording)
        if family == GENERAL and job.negative_prompt:
            log.warning("provider-a general model ignores negativePrompt (deployment %s)", job.model)

    # -- the call -------------------------------------------------------------------------------

    def _url(self, deployment: str, operation: str, api_version: str) -> str:
        return (f"{self.endpoint}/openai/deployments/{quote(deployment, safe='')}/images/{operation}"
                f"?api-version={quote(api_version, safe='')}")

    def generate(self, job: ImageJob, budget: Budget) -> ProviderImage:
        headers = {"api-key": self.api_key}
        if job.reference is not None:
            response = self.client.post(self._url(job.model, "edits", self.edit_api_version), budget,
                                        headers=headers, data=self._edit_fields(job), files=self._edit_files(job))
        else:
            response = self.client.post(self._url(job.model, "generations", self.api_version), budget,
                                        headers=headers, json=self._generation_body(job))
        if response.status != 200:
            raise self._error(response, job)
        return self._image(response, job)

    def _generation_body(self, job: ImageJob) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": job.prompt, "n": 1}
        if job.size:
            body["size"] = job.size
        if job.quality:
            body["quality"] = job.quality
        if self.family(job.model) == LEGACY:
            if job.style:
                body["style"] = job.style
            body["response_format"] = "b64_json"  # no second download from a temporary URL
        else:
            body["output_format"] = "png"
        return body

    @staticmethod
    def _edit_fields(job: ImageJob) -> dict[str, str]:
        fields = {"prompt": job.prompt, "n": "1"}
        if job.size:
            fields["size"] = job.size
        if job.quality:
            fields["quality"] = job.quality
        return fields

    @staticmethod
    def _edit_files(job: ImageJob) -> list[tuple[str, tuple[str, bytes, str]]]:
        ext = "png" if job.reference_mime == "image/png" else "jpg"
        files = [("image", (f"image.{ext}", job.reference or b"", job.reference_mime or "image/png"))]
        if job.mask is not None:
            files.append(("mask", ("mask.png", job.mask, "image/png")))
        return files

    def _image(self, response: UpstreamResponse, job: ImageJob) -> ProviderImage:
        payload = response.json()
        items = payload.get("data") if isinstance(payload, dict) else None
        if not items or not isinstance(items[0], dict) or not isinstance(items[0].get("b64_json"), str):
            raise unavailable(NAME, "provider-a returned no image.", response.status)
        try:
            data = base64.b64decode(items[0]["b64_json"], validate=True)
        except (binascii.Error, ValueError):
            raise unavailable(NAME, "provider-a returned an undecodable image.", response.status) from None
        revised = items[0].get("revised_prompt")
        return ProviderImage(data, revised if isinstance(revised, str) and revised else None,
                             self._usage(payload.get("usage")) if self.family(job.model) == GENERAL else None)

    @staticmethod
    def _usage(usage: Any) -> dict[str, int] | None:
        if not isinstance(usage, dict):
            return None
        try:
            inp, out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
            total = int(usage.get("total_tokens") or inp + out)
        except (TypeError, ValueError):
            return None
        return {"inputTokens": inp, "outputTokens": out, "totalTokens": total}

    def _error(self, response: UpstreamResponse, job: ImageJob) -> Exception:
        error, message = upstream_error(NAME, response)
        common = service_error(NAME, response, message)
        if common is not None:
            return common
        code = str(error.get("code") or "")
        inner = error.get("inner_error") or error.get("innererror") or {}
        inner_code = str(inner.get("code") or "") if isinstance(inner, dict) else ""
        details: dict[str, Any] = {"provider": NAME, "upstreamStatus": response.status}
        if code:
            details["upstreamCode"] = code
        if {code.lower(), inner_code.lower()} & CONTENT_POLICY_CODES:
            return InvalidInput(message, details | {"reason": "content_policy"})
        if response.status == 404:
            return InvalidInput(f"Unknown provider-a model or deployment '{job.model}': {message}", details)
        return InvalidInput(message, details)
