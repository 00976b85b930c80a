"""Image provider adapters behind one interface, built once per app from configuration.

The registry: every module of this package except `base` is an adapter whose class registers itself
(`@register`, app.images.providers.base) with its id, model families (what each takes: a reference
image, a mask) and the wording errors use. Importing the package imports them all, so a new provider
is one module here plus its settings in app.config; the accepted `provider` values, the mask rule
and the OpenAPI enum follow from the registry.
"""

from __future__ import annotations

import importlib
import pkgutil

from app.images.providers.base import (
    Budget,
    ImageJob,
    ImageProvider,
    ModelFamily,
    ProviderImage,
    mask_refusal,
    provider_class,
    provider_ids,
)
from app.registry import find_service

for _adapter in sorted(module.name for module in pkgutil.iter_modules(__path__)):
    if _adapter != "base":
        importlib.import_module(f"{__name__}.{_adapter}")  # its class registers itself

__all__ = ["Budget", "ImageJob", "ImageProvider", "ModelFamily", "ProviderImage", "build_provider", "get_provider",
           "mask_refusal", "provider_class", "provider_ids"]


def build_provider(config, name: str) -> ImageProvider:
    return provider_class(name).from_config(config)


def get_provider(name: str) -> ImageProvider:
    """The app's adapter for `name` (service `image_provider`, one per app, so its HTTP session pools
    connections)."""
    return find_service("image_provider", name)
