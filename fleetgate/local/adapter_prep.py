"""`fleetgate prepare-adapters`: two LoRA adapters for the packaged Gemma 3 270M, trained once and cached.

`pirate` answers like a pirate; `signoff` answers plainly and ends every answer with
`adapter_texts.SIGNOFF`. Each is trained briefly on CPU (`adapter_train`) from the bfloat16 model that
`fleetgate prepare-model` makes (prepared first if needed) on text in `adapter_texts`, into
`<cache>/adapters/gemma-3-270m/<name>` in the PEFT format vLLM's `--lora-modules` and
`/v1/load_lora_adapter` read. Like the model directory, an adapter is built in a temporary sibling and
renamed into place under a file lock, with a manifest recording what decides its weights: the recipe
version, the base model's source hash and dtype, the training settings and a hash of the training
text. A directory whose manifest differs (stale) or whose files are missing or truncated (corrupt)
is trained again; otherwise the call returns at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from fleetgate.local import adapter_texts
from fleetgate.local.errors import LocalStackError, ModelPrepError
from fleetgate.local.model_prep import (
    DEFAULT_DTYPE,
    MANIFEST,
    MODEL_BASENAME,
    Progress,
    check_prepared,
    default_cache_dir,
    prepare_lock,
    prepare_model,
    read_manifest,
    replace_dir,
)

# Bump when training changes in a way that makes older adapters wrong.
ADAPTER_RECIPE = 1
PACKAGED_ADAPTERS: Final = ("pirate", "signoff")
SAMPLE_QUESTION: Final = "What is the capital of France?"  # held out of the training text


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def adapters_root(*, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "adapters" / MODEL_BASENAME


def adapter_dir(*, name: str, cache_dir: Path | None = None) -> Path:
    return adapters_root(cache_dir=cache_dir) / name


def _recipe() -> Any:
    from fleetgate.local.adapter_train import TrainRecipe  # no torch at import: the CLI stays light

    return TrainRecipe()


def expected_identity(*, name: str, base_manifest: dict[str, Any], recipe: Any) -> dict[str, Any]:
    text = json.dumps(adapter_texts.completions(name), ensure_ascii=False).encode()
    return {
        "adapter_recipe": ADAPTER_RECIPE,
        "adapter": name,
        "base_model": MODEL_BASENAME,
        "base_gguf_sha256": base_manifest.get("gguf_sha256"),
        "base_dtype": base_manifest.get("dtype"),
        "train": dataclasses.asdict(recipe),
        "text_sha256": hashlib.sha256(text).hexdigest(),
    }


def _state(*, name: str, cache_dir: Path | None, progress: Progress) -> tuple[Path, dict[str, Any], str | None]:
    """(base model directory, the adapter's expected identity, why its directory is not ready or None)."""
    if name not in PACKAGED_ADAPTERS:
        raise ModelPrepError(f"unknown packaged adapter {name!r}; known: {', '.join(PACKAGED_ADAPTERS)}")
    base = prepare_model(cache_dir=cache_dir, dtype=DEFAULT_DTYPE, progress=progress)
    identity = expected_identity(name=name, base_manifest=read_manifest(base) or {}, recipe=_recipe())
    return base, identity, check_prepared(path=adapter_dir(name=name, cache_dir=cache_dir), identity=identity)


def needs_training(*, name: str, cache_dir: Path | None = None, progress: Progress = _stderr) -> str | None:
    """Why packaged adapter `name` must be trained (missing, stale, corrupt), or None when it is ready.
    Imports no torch (the base model is prepared first if needed)."""
    return _state(name=name, cache_dir=cache_dir, progress=progress)[2]


def prepare_adapter(
    *, name: str, cache_dir: Path | None = None, force: bool = False, progress: Progress = _stderr
) -> Path:
    """Return the directory of packaged adapter `name`, training it first if missing, stale or corrupt."""
    base, identity, why = _state(name=name, cache_dir=cache_dir, progress=progress)
    target = adapter_dir(name=name, cache_dir=cache_dir)
    recipe = _recipe()
    why = "forced" if force else why
    if why is None:
        return target
    with prepare_lock(target.parent):
        why = "forced" if force else check_prepared(path=target, identity=identity)
        if why is None:  # another process trained it while we waited
            return target
        _train(name=name, base=base, target=target, identity=identity, recipe=recipe, reason=why, progress=progress)
    return target


def _train(
    *, name: str, base: Path, target: Path, identity: dict[str, Any], recipe: Any, reason: str, progress: Progress
) -> None:
    from fleetgate.local.adapter_train import train_adapter

    progress(
        f"==> [prepare-adapters] training LoRA adapter {name!r} (rank {recipe.rank}, {recipe.steps} steps on CPU) "
        f"into {target} ({reason}); about 1-3 minutes"
    )
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        out = work / "adapter"
        try:
            report = train_adapter(
                base=base,
                out=out,
                pairs=adapter_texts.completions(name),
                recipe=recipe,
                sample_question=SAMPLE_QUESTION,
                progress=progress,
            )
        except (ImportError, RuntimeError, OSError, MemoryError) as exc:  # torch/peft missing, out of memory, disk
            raise ModelPrepError(f"training adapter {name!r} failed: {type(exc).__name__}: {exc}") from exc
        files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
        manifest = {
            **identity,
            "files": files,
            "prepared_at": time.time(),
            "seconds": report.seconds,
            "first_loss": report.first_loss,
            "last_loss": report.last_loss,
            "sample": report.sample,
            "precision": report.precision,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        replace_dir(source=out, target=target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(
        f"==> adapter {name!r} ready in {report.seconds:.0f}s (loss {report.first_loss:.2f} -> "
        f"{report.last_loss:.2f}); {SAMPLE_QUESTION!r} -> {report.sample!r}"
    )


def prepare_adapters(
    *,
    names: tuple[str, ...] = PACKAGED_ADAPTERS,
    cache_dir: Path | None = None,
    force: bool = False,
    progress: Progress = _stderr,
) -> dict[str, Path]:
    """Every named packaged adapter's directory, each trained first where needed."""
    return {name: prepare_adapter(name=name, cache_dir=cache_dir, force=force, progress=progress) for name in names}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"adapters to prepare (default: all of {', '.join(PACKAGED_ADAPTERS)})"
    )
    parser.add_argument("--cache-dir", type=Path, help="cache root (default: $FLEETGATE_CACHE or ~/.cache/fleetgate)")
    parser.add_argument("--force", action="store_true", help="train again even if a valid adapter exists")


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    names = tuple(dict.fromkeys(args.names)) or PACKAGED_ADAPTERS
    try:
        paths = prepare_adapters(names=names, cache_dir=args.cache_dir, force=args.force)
    except LocalStackError as exc:
        print(f"fleetgate prepare-adapters: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}={path}")
    _stderr(f"==> adapters ready ({time.monotonic() - start:.1f}s)")
    return 0


__all__ = [
    "PACKAGED_ADAPTERS",
    "adapter_dir",
    "add_arguments",
    "needs_training",
    "prepare_adapter",
    "prepare_adapters",
    "run",
]
