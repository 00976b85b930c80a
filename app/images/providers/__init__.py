"""Image provider adapters behind one interface, built once per app from configuration."""

from __future__ import annotations

from flask import current_app

from app.images.providers.base import Budget, ImageJob, ImageProvider, ProviderImage
from app.images.providers.provider_a import AzureImagesProvider
from app.images.providers.provider_b import ImagenProvider

PROVIDER_CLASSES: dict[str, type] = {"provider-a": AzureImagesProvider, "provider-b": ImagenProvider}

__all__ = ["Budget", "ImageJob", "ImageProvider", "ProviderImage", "PROVIDER_CLASSES", "get_provider"]


def get_provider(name: str) -> ImageProvider:
    """The app's adapter for `name` (one per process, so its HTTP session pools connections)."""
    providers = current_app.extensions.setdefault("image_providers", {})
    provider = providers.get(name)
    if provider is None:
        provider = providers[name] = PROVIDER_CLASSES[name].from_config(current_app.config)
    return provider
