"""provider-b: Google Imagen `predict` on Vertex AI.

`POST {base}/v1/projects/{project}/locations/{region}/publishers/google/models/{model}:predict`
with an OAuth bearer token: minted from service-account credentials (google-auth, refreshed before
expiry, shared by all threads) or a static configured token.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import math
import re
import threading
from typing import Any
from urllib.parse import quote

from app.errors import InvalidInput, ServiceUnavailable
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

NAME = "provider-b"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ASPECT_RATIOS = {"1:1": 1.0, "16:9": 16 / 9, "9:16": 9 / 16, "4:3": 4 / 3, "3:4": 3 / 4}
_PIXELS = re.compile(r"^([1-9][0-9]{1,4})x([1-9][0-9]{1,4})$")
MAX_SIDE = 8192
# Models that take `sampleImageSize` (1K/2K); others answer 400 when it is sent.
SAMPLE_SIZE_MODELS = ("imagen-4.0-generate", "imagen-4.0-ultra-generate")
SIZE_HINT = list(ASPECT_RATIOS) + ["WIDTHxHEIGHT (pixels, mapped to the nearest ratio)"]


def aspect_for_size(size: str | None) -> tuple[str, int | None]:
    """(aspectRatio, long side in pixels or None) for a ratio or a pixel string; ValueError otherwise."""
    if size is None:
        return "1:1", None
    if size in ASPECT_RATIOS:
        return size, None
    match = _PIXELS.match(size)
    if not match:
        raise ValueError(size)
    width, height = int(match.group(1)), int(match.group(2))
    if width > MAX_SIDE or height > MAX_SIDE:
        raise ValueError(size)
    ratio = math.log(width / height)
    nearest = min(ASPECT_RATIOS, key=lambda name: abs(math.log(ASPECT_RATIOS[name]) - ratio))
    return nearest, max(width, height)


class TokenSource:
    """OAuth access tokens for Vertex AI: a static token, or service-account credentials."""

    def __init__(self, credentials_path: str = "", access_token: str = "", session=None) -> None:
        self.credentials_path = credentials_path
        self.access_token = access_token
        self._session = session
        self._credentials = None
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        return bool(self.credentials_path or self.access_token)

    def token(self, timeout: float = 30.0) -> str:
        """A valid access token; a refresh (token endpoint call) is bounded by `timeout` seconds."""
        if not self.credentials_path:
            return self.access_token
        # google-auth loads only for a service-account credentials file
        from google.auth.exceptions import GoogleAuthError
        from google.auth.transport.requests import Request

        with self._lock:  # one refresh at a time; the other threads reuse its result
            try:
                if self._credentials is None:
                    from google.oauth2 import service_account

                    self._credentials = service_account.Credentials.from_service_account_file(
                        self.credentials_path, scopes=[CLOUD_PLATFORM_SCOPE])
                if not self._credentials.valid:
                    self._credentials.refresh(functools.partial(Request(session=self._session),
                                                                timeout=max(1.0, timeout)))
            except (GoogleAuthError, OSError, ValueError) as exc:
                log.error("provider-b: cannot obtain an access token: %s", exc)
                raise ServiceUnavailable("provider-b credentials could not be used to obtain a token.",
                                         {"provider": NAME}) from None
            return self._credentials.token

    def invalidate(self) -> None:
        with self._lock:
            if self._credentials is not None:
                self._credentials.token = None
                self._credentials.expiry = None


@register
class ImagenProvider(ImageProvider):
    id = NAME
    families = (ModelFamily("imagen", NAME, edit=True, mask=False),)  # a reference is inlined; no mask

    def __init__(self, base_url: str, project: str, location: str, tokens: TokenSource,
                 client: UpstreamClient | None = None) -> None:
        self.base_url = (base_url or f"https://{location}-aiplatform.googleapis.com").rstrip("/")
        self.project = project
        self.location = location
        self.client = client or UpstreamClient(NAME, self.base_url)
        self.tokens = tokens
        if tokens._session is None:
            tokens._session = self.client.session

    @classmethod
    def from_config(cls, config) -> ImagenProvider:
        tokens = TokenSource(config["PROVIDER_B_CREDENTIALS"], config["PROVIDER_B_ACCESS_TOKEN"])
        return cls(config["PROVIDER_B_ENDPOINT"], config["PROVIDER_B_PROJECT"], config["PROVIDER_B_LOCATION"],
                   tokens)

    @property
    def configured(self) -> bool:
        return bool(self.project and self.location and self.tokens.configured)

    def check_options(self, job: ImageJob) -> None:
        try:
            aspect_for_size(job.size)
        except ValueError:
            reject_option("size", job.size or "", SIZE_HINT, "provider-b")

    def _url(self, model: str) -> str:
        return (f"{self.base_url}/v1/projects/{quote(self.project, safe='')}/locations/"
                f"{quote(self.location, safe='')}/publishers/google/models/{quote(model, safe='')}:predict")

    def request_body(self, job: ImageJob) -> dict[str, Any]:
        aspect, long_side = aspect_for_size(job.size)
        instance: dict[str, Any] = {"prompt": job.prompt}
        if job.reference is not None:
            instance["referenceImages"] = [{
                "referenceType": "REFERENCE_TYPE_RAW", "referenceId": 1,
                "referenceImage": {"bytesBase64Encoded": base64.b64encode(job.reference).decode("ascii")},
            }]
        parameters: dict[str, Any] = {"sampleCount": 1, "aspectRatio": aspect,
                                      "outputOptions": {"mimeType": "image/png"}}
        if job.negative_prompt:
            parameters["negativePrompt"] = job.negative_prompt
        if long_side is not None and job.model.startswith(SAMPLE_SIZE_MODELS):
            parameters["sampleImageSize"] = "2K" if long_side > 1024 else "1K"
        return {"instances": [instance], "parameters": parameters}

    def generate(self, job: ImageJob, budget: Budget) -> ProviderImage:
        body = self.request_body(job)
        token = self.tokens.token(min(30.0, budget.remaining()))
        response = self.client.post(self._url(job.model), budget, json=body,
                                    headers={"Authorization": f"Bearer {token}"})
        if response.status != 200:
            raise self._error(response, job)
        return self._image(response)

    def _image(self, response: UpstreamResponse) -> ProviderImage:
        payload = response.json()
        if not isinstance(payload, dict):
            raise unavailable(NAME, "provider-b returned an unreadable response.", response.status)
        predictions = [p for p in payload.get("predictions") or [] if isinstance(p, dict)]
        image = next((p for p in predictions if isinstance(p.get("bytesBase64Encoded"), str)), None)
        if image is None:
            reason = next((str(p["raiFilteredReason"]) for p in predictions if p.get("raiFilteredReason")), None)
            raise InvalidInput(reason or "provider-b returned no image: the prompt was blocked by its safety filters.",
                               {"provider": NAME, "reason": "content_policy"})
        try:
            data = base64.b64decode(image["bytesBase64Encoded"], validate=True)
        except (binascii.Error, ValueError):
            raise unavailable(NAME, "provider-b returned an undecodable image.", response.status) from None
        enhanced = image.get("prompt")
        return ProviderImage(data, enhanced if isinstance(enhanced, str) and enhanced else None, None)

    def _error(self, response: UpstreamResponse, job: ImageJob) -> Exception:
        error, message = upstream_error(NAME, response)
        if response.status in (401, 403):
            self.tokens.invalidate()  # the next call mints a fresh token
        common = service_error(NAME, response, message)
        if common is not None:
            return common
        details: dict[str, Any] = {"provider": NAME, "upstreamStatus": response.status}
        if error.get("status"):
            details["upstreamCode"] = str(error["status"])
        if response.status == 404:
            return InvalidInput(f"Unknown provider-b model '{job.model}': {message}", details)
        return InvalidInput(message, details)
