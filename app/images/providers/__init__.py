"""Image provider adapters behind one interface, built once per app from configuration."""

from __future__ import annotations

from app.images.providers.base import Budget, ImageJob, ImageProvider, ProviderImage
from app.images.providers.provider_a import AzureImagesProvider
from app.images.providers.provider_b import ImagenProvider
from app.registry import find_service

PROVIDER_CLASSES: dict[str, type] = {"provider-a": AzureImagesProvider, "provider-b": ImagenProvider}

__all__ = ["Budget", "ImageJob", "ImageProvider", "ProviderImage", "PROVIDER_CLASSES", "build_provider",
           "get_provider"]


def build_provider(config, name: str) -> ImageProvider:
    return PROVIDER_CLASSES[name].from_config(config)


def get_provider(name: str) -> ImageProvider:
    """The app's adapter for `name` (service `image_provider`, one per app, so its HTTP session pools
    connections)."""
    return find_service("image_provider", name)
