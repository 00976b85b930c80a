"""GcsBlobStore with the real google-cloud-storage client against gcp-storage-emulator."""

from __future__ import annotations

import pytest
import requests

from app.storage import build_blob_store
from app.storage.base import BlobNotFound, BlobStoreError
from app.storage.gcs import CACHE_CONTROL, GcsBlobStore
from app.storage.keys import image_key, org_segment
from tests.images_fakes import GcsEmulator, jpeg_bytes, png_bytes


@pytest.fixture(scope="module")
def emulator():
    emu = GcsEmulator()
    yield emu
    emu.close()


@pytest.fixture()
def store(emulator):
    return build_blob_store({"BLOB_BACKEND": "gcs", "BLOB_CONTAINER": emulator.bucket, "BLOB_PUBLIC_BASE_URL": "",
                             "GCS_PROJECT": "test", "GCS_ENDPOINT": emulator.endpoint})


def test_built_from_config_with_bucket_as_container(store, emulator):
    assert isinstance(store, GcsBlobStore)
    assert store.container == emulator.bucket
    assert store.public_base_url == f"{emulator.endpoint}/{emulator.bucket}"


def test_put_get_roundtrip_with_metadata(store, emulator):
    data = png_bytes(32, 32)
    key = image_key("org-gcs", "image/png")
    url = store.put(key, data, "image/png")
    assert url == f"{emulator.endpoint}/{emulator.bucket}/{key}"
    assert store.get(key) == data
    blob = store.client.bucket(emulator.bucket).get_blob(key)
    assert blob.content_type == "image/png" and blob.cache_control == CACHE_CONTROL
    public = requests.get(url, timeout=10)  # the public URL serves the same bytes
    assert public.status_code == 200 and public.content == data


def test_key_for_url_round_trips_our_urls_only(store):
    key = image_key("org-gcs", "image/jpeg")
    url = store.put(key, jpeg_bytes(), "image/jpeg")
    assert store.key_for_url(url) == key
    assert store.key_for_url("https://storage.googleapis.com/another-bucket/" + key) is None


def test_missing_key_is_blob_not_found(store):
    with pytest.raises(BlobNotFound):
        store.get("images/org-gcs/2026-01-01/missing.png")


def test_check_passes_for_the_bucket_and_fails_for_a_missing_one(store, emulator):
    store.check()
    missing = GcsBlobStore("no-such-bucket", "https://x", endpoint=emulator.endpoint)
    with pytest.raises(BlobStoreError):
        missing.check()


def test_unreachable_endpoint_is_blob_store_error(monkeypatch):
    # google-cloud-storage looks up a bucket's metadata for its trace spans on a daemon thread of its own,
    # retried for up to two minutes with jitter from the random module: against this dead endpoint it
    # outlived the test and moved that module's state under the worker's later property tests
    # (Hypothesis's "Do not use the random module inside strategies" warning). Off for this client.
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
    dead = GcsBlobStore("b", "https://x", endpoint="http://127.0.0.1:9", timeout=2)
    with pytest.raises(BlobStoreError):
        dead.put("images/o/2026-01-01/k.png", b"x", "image/png")


def test_image_key_layout():
    key = image_key("acme", "image/png")
    parts = key.split("/")
    assert parts[0] == "images" and parts[1] == "acme" and len(parts[2]) == 10 and parts[3].endswith(".png")
    assert image_key("acme", "image/jpeg").endswith(".jpg")


@pytest.mark.parametrize("org", ["../etc", "a/b", ".", "..", "x y", ""])
def test_unsafe_org_ids_become_a_digest_segment(org):
    segment = org_segment(org)
    assert segment.startswith("x-") and "/" not in segment and segment == org_segment(org)
