"""Inspecting image bytes: the MIME type comes from the bytes, dimensions from a real decode."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
# Decompression-bomb guard: well above the largest upstream size (about 4096 x 4096).
MAX_PIXELS = 40_000_000


class NotAnImage(ValueError):
    """The bytes are not a decodable PNG or JPEG within the pixel cap."""


@dataclass(frozen=True)
class ImageInfo:
    mime_type: str
    width: int
    height: int
    has_alpha: bool

    @property
    def extension(self) -> str:
        return "png" if self.mime_type == "image/png" else "jpg"


def sniff_mime(data: bytes) -> str | None:
    """`image/png` or `image/jpeg` by magic bytes, else None."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(JPEG_MAGIC):
        return "image/jpeg"
    return None


def inspect_image(data: bytes, *, decode: bool = True) -> ImageInfo:
    """Check magic bytes, then decode with Pillow under a pixel cap.

    `decode=False` (images from the configured provider) parses the headers and verifies the file
    structure (PNG chunk CRCs) without inflating every pixel; caller-supplied bytes get the full decode.
    """
    mime = sniff_mime(data)
    if mime is None:
        raise NotAnImage("not a PNG or JPEG")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["PNG" if mime == "image/png" else "JPEG"]) as img:
                width, height = img.size
                if width * height > MAX_PIXELS:
                    raise NotAnImage("image too large")
                has_alpha = img.mode in {"RGBA", "LA", "PA", "RGBa", "La"} or (
                    img.mode == "P" and "transparency" in img.info)
                if decode:
                    img.load()  # a truncated or corrupt body fails here, not later
                else:
                    img.verify()
    except NotAnImage:
        raise
    except Exception as exc:  # Pillow raises many types for bad data
        raise NotAnImage(f"undecodable image: {type(exc).__name__}") from None
    return ImageInfo(mime, width, height, has_alpha)
