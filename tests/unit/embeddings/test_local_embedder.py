"""The local backend: real all-MiniLM-L6-v2 embeddings from the packaged model, loaded once per session."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import pytest
from flask import Flask

from app.config import load_config
from app.embeddings import EmbedderConfigError, EmbedderError, build_embedder, build_embedder_service, get_embedder
from app.embeddings import local as local_backend
from app.embeddings.local import DEFAULT_LOCAL_MODEL, LocalEmbedder, bundled_model_path
from app.registry import init_registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CARS = "Used sedan for sale\ndescription: four-door family car, low mileage, new tyres, automatic gearbox"
BREAD = "Sourdough loaf\ndescription: bread recipe with flour, water, salt and a long slow rise in the oven"
PLANTS = "Monstera care\ndescription: water the houseplant weekly and keep it out of direct sun"


@pytest.fixture(scope="session")
def embedder() -> LocalEmbedder:
    return build_embedder(load_config({"EMBEDDINGS_BACKEND": "local", "EMBEDDINGS_MODEL": ""}))


def cosine_distance(a, b) -> float:
    return 1.0 - sum(x * y for x, y in zip(a, b, strict=True))


def test_model_and_dimensions(embedder):
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.model == DEFAULT_LOCAL_MODEL == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.dimensions == 384
    assert embedder.embed_one("hello world").__len__() == 384


def test_vectors_are_unit_length(embedder):
    for vector in embedder.embed([CARS, BREAD, "x", "a much longer text " * 200]):
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0, abs=1e-5)


def test_automobile_is_closest_to_the_car_record(embedder):
    query, cars, bread, plants = embedder.embed(["automobile", CARS, BREAD, PLANTS])
    assert cosine_distance(query, cars) < cosine_distance(query, bread)
    assert cosine_distance(query, cars) < cosine_distance(query, plants)


def test_baking_is_closest_to_the_bread_recipe(embedder):
    query, cars, bread, plants = embedder.embed(["baking", CARS, BREAD, PLANTS])
    assert cosine_distance(query, bread) < cosine_distance(query, cars)
    assert cosine_distance(query, bread) < cosine_distance(query, plants)


def test_paraphrases_are_closer_than_unrelated_text(embedder):
    a, b, c = embedder.embed(["The meeting was moved to Thursday", "We rescheduled the meeting for Thursday",
                              "The printer on floor three is out of toner"])
    assert cosine_distance(a, b) < 0.4 < cosine_distance(a, c)


def test_batched_and_single_embeddings_agree(embedder):
    texts = [CARS, BREAD, PLANTS, "short"]
    batch = embedder.embed(texts)
    for text, vector in zip(texts, batch, strict=True):
        assert embedder.embed_one(text) == pytest.approx(vector, abs=1e-5)


def test_inputs_larger_than_the_batch_size_are_split(embedder):
    small = LocalEmbedder(bundled_model_path(), model_name=DEFAULT_LOCAL_MODEL, max_batch_size=2)
    texts = [f"record number {i} about topic {i % 3}" for i in range(5)]
    for split, whole in zip(small.embed(texts), embedder.embed(texts), strict=True):
        assert split == pytest.approx(whole, abs=1e-5)


def test_blank_text_is_refused(embedder):
    with pytest.raises(EmbedderError, match="index 1 is blank"):
        embedder.embed(["fine", ""])


def test_model_is_shared_within_the_process(embedder):
    other = build_embedder(load_config({"EMBEDDINGS_BACKEND": "local"}))
    assert other is not embedder and other._loaded() is embedder._loaded()


def test_get_embedder_returns_one_instance_per_app():
    app = Flask(__name__)
    app.config.update(load_config({"EMBEDDINGS_BACKEND": "local"}))
    init_registry(app, {"embedder": build_embedder_service})
    with app.app_context():
        first = get_embedder()
        assert get_embedder("text-embedding-3-large", 1024) is first  # local: one model for every definition


def test_concurrent_first_use_loads_the_model_once(monkeypatch):
    calls = []

    def slow_load(path, threads):
        calls.append(path)
        time.sleep(0.2)
        return local_backend._LoadedModel(object(), 384, 0.2)

    monkeypatch.setattr(local_backend, "_load", slow_load)
    monkeypatch.setattr(local_backend, "_models", {})
    results = []
    threads = [threading.Thread(target=lambda: results.append(local_backend.load_model("/models/x")))
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["/models/x"] and len({id(r) for r in results}) == 1


def test_dimensions_are_known_without_loading_the_model(monkeypatch):
    monkeypatch.setattr(local_backend, "_models", {})
    monkeypatch.setattr(local_backend, "_load", lambda *a: pytest.fail("dimensions must not load the model"))
    assert LocalEmbedder().dimensions == 384


@pytest.mark.parametrize("name", ["", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"])
def test_the_bundled_model_by_name(name):
    embedder = build_embedder(load_config({"EMBEDDINGS_BACKEND": "local", "EMBEDDINGS_MODEL": name}))
    assert embedder.path == str(bundled_model_path().resolve()) and embedder.model == DEFAULT_LOCAL_MODEL


def test_a_directory_that_is_no_model_is_refused(tmp_path):
    with pytest.raises(EmbedderConfigError, match="not a sentence-transformers model directory"):
        build_embedder(load_config({"EMBEDDINGS_BACKEND": "local", "EMBEDDINGS_MODEL": str(tmp_path)}))


def test_loads_and_embeds_with_no_network():
    # A fresh interpreter whose every HTTP(S) request would go to a dead proxy, and without the
    # offline switches in its environment: the model must still load from the package alone.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="",
               HF_HOME=os.path.join(ROOT, "var", "test", "hf-home-empty"))
    script = ("from app.embeddings.local import LocalEmbedder; import os; e = LocalEmbedder(); "
              "print(len(e.embed_one('offline check')), os.environ['HF_HUB_OFFLINE'])")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["384", "1"]
    assert not os.path.exists(os.path.join(env["HF_HOME"], "hub"))  # nothing was fetched into a hub cache
