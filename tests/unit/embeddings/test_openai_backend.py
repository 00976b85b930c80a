"""The OpenAI-compatible embedder against a fake upstream on loopback: wire format and error classes."""

from __future__ import annotations

import math
import socket
import time
from email.utils import formatdate

import pytest

from app.embeddings import EmbedderConfigError, EmbedderError, EmbedderTransientError, build_embedder
from app.embeddings.openai_compat import OpenAICompatibleEmbedder
from tests.fake_embeddings_server import FakeEmbeddingsServer


@pytest.fixture()
def fake():
    with FakeEmbeddingsServer(api_key="sk-test-123") as server:
        yield server


def embedder_for(server: FakeEmbeddingsServer, **kwargs) -> OpenAICompatibleEmbedder:
    kwargs.setdefault("model", "text-embedding-3-small")
    return OpenAICompatibleEmbedder(server.base_url, server.api_key, **kwargs)


def test_wire_format_path_auth_and_body(fake):
    vectors = embedder_for(fake).embed(["first text", "second text"])

    assert len(fake.requests) == 1
    request = fake.requests[0]
    assert request.path == "/v1/embeddings"
    assert request.headers["Authorization"] == "Bearer sk-test-123"
    assert "api-key" not in {k.lower() for k in request.headers}
    assert request.headers["Content-Type"] == "application/json"
    assert request.body == {"model": "text-embedding-3-small", "input": ["first text", "second text"]}
    assert [len(v) for v in vectors] == [1536, 1536]


def test_vectors_follow_input_order_and_are_normalised(fake):
    texts = ["alpha", "beta", "gamma"]
    vectors = embedder_for(fake, dimensions=16).embed(texts)  # the fake answers in reverse order

    for text, vector in zip(texts, vectors, strict=True):
        raw = FakeEmbeddingsServer.vector_for(text, 16)
        norm = math.sqrt(sum(x * x for x in raw))
        assert vector == pytest.approx([x / norm for x in raw])
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0)


def test_dimensions_are_passed_through(fake):
    embedder = embedder_for(fake, model="text-embedding-3-large", dimensions=256)
    vectors = embedder.embed(["some text"])

    assert fake.requests[0].body == {"model": "text-embedding-3-large", "input": ["some text"], "dimensions": 256}
    assert len(vectors[0]) == 256 and embedder.dimensions == 256


def test_default_model_is_text_embedding_3_large(fake):
    embedder = OpenAICompatibleEmbedder(fake.base_url, fake.api_key)
    embedder.embed(["x"])

    assert embedder.model == "text-embedding-3-large" and embedder.dimensions == 3072
    assert fake.requests[0].body["model"] == "text-embedding-3-large"
    assert "dimensions" not in fake.requests[0].body


def test_batches_split_into_several_requests_in_order(fake):
    texts = [f"text number {i}" for i in range(7)]
    vectors = embedder_for(fake, max_batch_size=3, dimensions=8).embed(texts)

    assert [r.body["input"] for r in fake.requests] == [texts[0:3], texts[3:6], texts[6:7]]
    assert len(vectors) == 7
    single = embedder_for(fake, dimensions=8).embed([texts[4]])[0]
    assert vectors[4] == pytest.approx(single)


def test_batch_size_is_capped_at_the_api_limit(fake):
    assert embedder_for(fake, max_batch_size=10_000).max_batch_size == 2048


def test_connection_is_pooled_across_requests(fake):
    embedder = embedder_for(fake, max_batch_size=1, dimensions=4)
    embedder.embed(["a", "b", "c"])
    # One pooled connection carried all three requests (HTTP/1.1 keep-alive).
    assert len(fake.requests) == 3
    assert len({r.client_port for r in fake.requests}) == 1


def test_azure_api_key_header_and_deployment_url():
    with FakeEmbeddingsServer(api_key="azure-key", auth_header="api-key",
                              prefix="/openai/deployments/emb", query="api-version=2024-10-21") as server:
        embedder = OpenAICompatibleEmbedder(server.base_url, "azure-key", auth_header="api-key",
                                            model="text-embedding-3-small")
        embedder.embed(["hello"])

        request = server.requests[0]
        assert request.path == "/openai/deployments/emb/embeddings?api-version=2024-10-21"
        assert request.headers["api-key"] == "azure-key" and "Authorization" not in request.headers


def test_auto_auth_header_picks_api_key_for_azure_hosts():
    azure = OpenAICompatibleEmbedder("https://acme.openai.azure.com/openai/v1", "k")
    other = OpenAICompatibleEmbedder("https://api.openai.com/v1", "k")
    assert azure._headers.get("api-key") == "k" and "Authorization" not in azure._headers
    assert other._headers.get("Authorization") == "Bearer k" and "api-key" not in other._headers
    assert azure.url == "https://acme.openai.azure.com/openai/v1/embeddings"


def test_429_is_transient_with_retry_after_seconds(fake):
    fake.fail_next(429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
                   headers={"Retry-After": "7"})
    with pytest.raises(EmbedderTransientError) as info:
        embedder_for(fake).embed(["x"])
    assert info.value.status == 429 and info.value.retry_after == 7.0
    assert "Rate limit reached" in info.value.message


def test_429_retry_after_as_http_date_and_ms(fake):
    fake.fail_next(429, headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    with pytest.raises(EmbedderTransientError) as info:
        embedder_for(fake).embed(["x"])
    assert 25 <= info.value.retry_after <= 31

    fake.fail_next(429, headers={"retry-after-ms": "1500", "Retry-After": "2"})
    with pytest.raises(EmbedderTransientError) as info:
        embedder_for(fake).embed(["x"])
    assert info.value.retry_after == 1.5


def test_429_for_exhausted_quota_is_permanent(fake):
    fake.fail_next(429, {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}})
    with pytest.raises(EmbedderError) as info:
        embedder_for(fake).embed(["x"])
    assert not isinstance(info.value, EmbedderTransientError) and info.value.status == 429


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_transient(fake, status):
    fake.fail_next(status)
    with pytest.raises(EmbedderTransientError) as info:
        embedder_for(fake).embed(["x"])
    assert info.value.status == status and info.value.retry_after is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_4xx_is_permanent(fake, status):
    fake.fail_next(status, {"error": {"message": "This model's maximum context length is 8192 tokens"}})
    with pytest.raises(EmbedderError) as info:
        embedder_for(fake).embed(["x"])
    assert not isinstance(info.value, EmbedderTransientError)
    assert info.value.status == status and "maximum context length" in info.value.message


def test_a_genuine_400_from_the_upstream_is_permanent():
    # No scripted failure: the upstream's own input limit is smaller than our batch size.
    with FakeEmbeddingsServer(max_inputs=2) as server:
        with pytest.raises(EmbedderError) as info:
            embedder_for(server, max_batch_size=3).embed(["a", "b", "c"])
    assert info.value.status == 400 and not isinstance(info.value, EmbedderTransientError)
    assert "at most 2 inputs" in info.value.message


def test_wrong_key_is_permanent_and_never_echoes_the_key(fake):
    embedder = OpenAICompatibleEmbedder(fake.base_url, "sk-wrong-secret", model="text-embedding-3-small")
    with pytest.raises(EmbedderError) as info:
        embedder.embed(["x"])
    assert info.value.status == 401 and not isinstance(info.value, EmbedderTransientError)
    assert "sk-wrong-secret" not in str(info.value)


def test_connection_refused_is_transient():
    with socket.socket() as sock:  # a port nobody listens on: bind, read it, close
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    embedder = OpenAICompatibleEmbedder(f"http://127.0.0.1:{port}/v1", "k", timeout=2)
    with pytest.raises(EmbedderTransientError) as info:
        embedder.embed(["x"])
    assert info.value.status is None and "cannot reach" in info.value.message


def test_dropped_connection_is_transient(fake):
    fake.fail_next(0, drop_connection=True)
    with pytest.raises(EmbedderTransientError):
        embedder_for(fake).embed(["x"])


def test_read_timeout_is_transient():
    with socket.socket() as listener:  # accepts the connection, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        embedder = OpenAICompatibleEmbedder(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "k", timeout=0.3)
        with pytest.raises(EmbedderTransientError) as info:
            embedder.embed(["x"])
    assert "timed out" in info.value.message


def test_malformed_answers_are_permanent(fake):
    fake.fail_next(200, {"data": [{"index": 0}]})
    with pytest.raises(EmbedderError, match="malformed"):
        embedder_for(fake).embed(["x"])

    fake.fail_next(200, {"data": [{"index": 0, "embedding": [1.0, 0.0]}]})
    with pytest.raises(EmbedderError, match="1 vectors for 2 inputs"):
        embedder_for(fake).embed(["x", "y"])

    fake.fail_next(200, {"data": [{"index": 0, "embedding": "AAAAAA=="}]})
    with pytest.raises(EmbedderError, match="encoding_format"):
        embedder_for(fake).embed(["x"])

    fake.fail_next(200, {"data": [{"index": 0, "embedding": [0.0, 0.0]}]})
    with pytest.raises(EmbedderError, match="zero"):
        embedder_for(fake).embed(["x"])


def test_wrong_dimension_count_is_rejected(fake):
    fake.fail_next(200, {"data": [{"index": 0, "embedding": [1.0, 2.0, 3.0]}]})
    with pytest.raises(EmbedderError, match=r"\[3\] dimensions, expected 8"):
        embedder_for(fake, dimensions=8).embed(["x"])


def test_blank_and_non_string_inputs_are_rejected_before_any_request(fake):
    embedder = embedder_for(fake)
    with pytest.raises(EmbedderError, match="index 1 is blank"):
        embedder.embed(["ok", "   "])
    with pytest.raises(EmbedderError, match="index 0 is int"):
        embedder.embed([3])
    with pytest.raises(EmbedderError, match="not a single string"):
        embedder.embed("a string")
    assert embedder.embed([]) == []
    assert fake.requests == []


@pytest.mark.parametrize("kwargs, message", [
    ({"endpoint": ""}, "EMBEDDINGS_ENDPOINT is not set"),
    ({"endpoint": "ftp://x/v1"}, "http"),
    ({"auth_header": "basic"}, "EMBEDDINGS_AUTH_HEADER"),
    ({"dimensions": 0}, "positive"),
    ({"max_batch_size": 0}, "at least 1"),
])
def test_bad_configuration_is_refused(kwargs, message):
    args = {"endpoint": "http://127.0.0.1:9/v1", **kwargs}
    with pytest.raises(EmbedderConfigError, match=message):
        OpenAICompatibleEmbedder(args.pop("endpoint"), "k", **args)


def test_factory_builds_the_openai_backend_from_config(fake):
    config = {"EMBEDDINGS_BACKEND": "openai", "EMBEDDINGS_ENDPOINT": fake.base_url, "EMBEDDINGS_API_KEY": "sk-test-123",
              "EMBEDDINGS_MODEL": "", "EMBEDDINGS_DIMENSIONS": 0, "EMBEDDINGS_BATCH_SIZE": 2,
              "EMBEDDINGS_TIMEOUT_SECONDS": 5, "EMBEDDINGS_AUTH_HEADER": "auto"}
    default = build_embedder(config)
    assert default.model == "text-embedding-3-large" and default.max_batch_size == 2

    per_definition = build_embedder(config, model="text-embedding-3-small", dimensions=64)
    vectors = per_definition.embed(["a", "b", "c"])
    assert [len(v) for v in vectors] == [64, 64, 64]
    assert [r.body for r in fake.requests] == [
        {"model": "text-embedding-3-small", "input": ["a", "b"], "dimensions": 64},
        {"model": "text-embedding-3-small", "input": ["c"], "dimensions": 64},
    ]


def test_factory_rejects_unknown_backend():
    with pytest.raises(EmbedderConfigError, match="unknown EMBEDDINGS_BACKEND 'hash'"):
        build_embedder({"EMBEDDINGS_BACKEND": "hash"})
