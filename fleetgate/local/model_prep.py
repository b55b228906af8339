"""`fleetgate prepare-model`: the packaged Gemma 3 270M GGUF -> a cached vLLM model directory.

Done once per (package version, dtype, recipe) into `<cache>/models/gemma-3-270m-<dtype>`, where
`<cache>` is `--cache-dir`, else `$FLEETGATE_CACHE`, else `~/.cache/fleetgate`. The work happens in
a temporary sibling directory that is renamed into place only when complete, under a file lock so
two processes never prepare at once. A manifest records the source package version and hash, the
dtype, the recipe version and every file's size; a directory whose manifest does not match (stale)
or whose files are missing or truncated (corrupt) is prepared again.

`--quantization SCHEME` prepares `<cache>/models/gemma-3-270m-<scheme>` from the bfloat16 directory
(prepared first if needed): `w4a16|w8a8`, the bf16 weights quantized by `fleetgate.local.quantize` (round
to nearest); `w4a16-gptq`, by `gptq_recipe.py` run with the Python of a separate environment that has
llmcompressor (`--quantizer-python` or `$FLEETGATE_QUANTIZER_PYTHON`); `w4a16-gguf|gguf-e4|gguf-e8`,
built from the GGUF's own blocks, embedding included, by `fleetgate.local.gguf_quantize` (the GGUF is
assembled again). The tokenizer files are copied. The manifest also records the scheme, so the same
staleness rules apply.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from fleetgate.local import gguf_source
from fleetgate.local.errors import LocalStackError, ModelPrepError
from fleetgate.local.schemes import GGUF_QUANTIZATIONS, GPTQ_SCHEME, QUANTIZATIONS

# Bump when the conversion changes in a way that makes older prepared directories wrong.
RECIPE = 2
MANIFEST = "fleetgate-manifest.json"
MODEL_BASENAME = "gemma-3-270m"
DEFAULT_DTYPE: Final = "bfloat16"
DEFAULT_MAX_MODEL_LEN = 32768
QUANTIZER_PYTHON_ENV: Final = "FLEETGATE_QUANTIZER_PYTHON"
TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")

Progress = Callable[[str], None]


def default_cache_dir() -> Path:
    env = os.environ.get("FLEETGATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fleetgate"


def model_dir(*, cache_dir: Path | None = None, dtype: str = DEFAULT_DTYPE, quantization: str | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / f"{MODEL_BASENAME}-{quantization or dtype}"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def expected_identity(*, source: gguf_source.GgufSource, dtype: str, quantization: str | None = None) -> dict[str, Any]:
    identity: dict[str, Any] = {
        "recipe": RECIPE,
        "package": gguf_source.PACKAGE,
        "package_version": source.version,
        "gguf_sha256": source.sha256,
        "dtype": dtype,
    }
    if quantization is not None:
        identity["quantization"] = quantization
    return identity


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_prepared(*, path: Path, identity: dict[str, Any]) -> str | None:
    """None when `path` holds a complete directory prepared for `identity`, else why it does not."""
    if not path.is_dir():
        return "not prepared yet"
    manifest = read_manifest(path)
    if manifest is None:
        return "no readable manifest"
    for key, want in identity.items():
        if manifest.get(key) != want:
            return f"stale: {key} is {manifest.get(key)!r}, want {want!r}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "manifest lists no files"
    for name, size in files.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            return f"corrupt: {name} is missing or has the wrong size"
    return None


@contextmanager
def prepare_lock(directory: Path) -> Iterator[None]:
    """Hold the preparation lock of `directory` (created): one process prepares into it at a time."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".prepare.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_model(
    *,
    cache_dir: Path | None = None,
    dtype: str = DEFAULT_DTYPE,
    force: bool = False,
    progress: Progress = _stderr,
    quantization: str | None = None,
    quantizer_python: Path | None = None,
) -> Path:
    """Return a ready model directory, preparing it first if it is missing, stale or corrupt.

    With `quantization` (a key of `fleetgate.local.quantize.SCHEMES`), the quantized directory, made from
    the `dtype` one.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ModelPrepError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)}")
    source = gguf_source.locate()
    identity = expected_identity(source=source, dtype=dtype, quantization=quantization)
    target = model_dir(cache_dir=cache_dir, dtype=dtype, quantization=quantization)
    why = "forced" if force else check_prepared(path=target, identity=identity)
    if why is None:
        return target
    if quantization == GPTQ_SCHEME and quantizer_python is None:
        quantizer_python = _quantizer_python()  # only needed when there is something to build
    base = None
    if quantization is not None:
        base = prepare_model(cache_dir=cache_dir, dtype=dtype, progress=progress)
    with prepare_lock(target.parent):
        why = "forced" if force else check_prepared(path=target, identity=identity)
        if why is None:  # another process finished it while we waited
            return target
        _build(
            source=source, identity=identity, target=target, reason=why, progress=progress, base=base,
            quantizer_python=quantizer_python,
        )
    return target


def replace_dir(*, source: Path, target: Path) -> None:
    """Put the complete directory `source` at `target` (a sibling), replacing what was there."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    source.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _quantizer_python() -> Path:
    env = os.environ.get(QUANTIZER_PYTHON_ENV)
    if not env or not Path(env).is_file():
        raise ModelPrepError(
            f"{GPTQ_SCHEME} runs llmcompressor, whose pins clash with vLLM's, from its own environment: "
            "python3 -m venv ~/.venvs/quantizer && ~/.venvs/quantizer/bin/pip install torch==2.13.0 "
            f"llmcompressor==0.14.0.1, then pass --quantizer-python ~/.venvs/quantizer/bin/python or set "
            f"{QUANTIZER_PYTHON_ENV}" + (f" ({env} is not a file)" if env else "")
        )
    return Path(env)


def _quantize(
    *, base: Path, out: Path, scheme: str, quantizer_python: Path | None, source: gguf_source.GgufSource, work: Path
) -> None:
    if scheme in GGUF_QUANTIZATIONS:
        from fleetgate.local.gguf_quantize import build_checkpoint

        gguf_path = gguf_source.assemble(source=source, target=work / "gguf" / source.file_name)
        build_checkpoint(gguf_path=gguf_path, base=base, out_dir=out, scheme=scheme)
    elif scheme == GPTQ_SCHEME:
        assert quantizer_python is not None  # resolved in prepare_model
        recipe = Path(__file__).with_name("gptq_recipe.py")
        done = subprocess.run([str(quantizer_python), str(recipe), str(base), str(out)], check=False)
        if done.returncode != 0:
            raise ModelPrepError(f"GPTQ with {quantizer_python} failed (exit {done.returncode}); see its output above")
    else:
        from fleetgate.local.quantize import quantize_checkpoint

        quantize_checkpoint(source=base, out_dir=out, scheme=scheme)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, out / name)


def _build(
    *,
    source: gguf_source.GgufSource,
    identity: dict[str, Any],
    target: Path,
    reason: str,
    progress: Progress,
    base: Path | None = None,
    quantizer_python: Path | None = None,
) -> None:
    start = time.monotonic()

    def step(n: int, text: str) -> None:
        progress(f"==> [prepare-model {n}/4, {time.monotonic() - start:5.1f}s] {text}")

    variant = identity.get("quantization", identity["dtype"])
    step(0, f"preparing {MODEL_BASENAME} ({variant}) into {target} ({reason}); first time ~1-2 min")
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        out = work / "model"
        out.mkdir()
        if base is not None:
            scheme = identity["quantization"]
            how = {GPTQ_SCHEME: "llmcompressor GPTQ"}.get(scheme, "compressed-tensors, round to nearest")
            if scheme in GGUF_QUANTIZATIONS:
                how = f"from the GGUF's blocks, embedding included; ~3 min on 2 cores, {base.name} for the rest"
            step(1, f"quantizing to {scheme} ({how})")
            _quantize(base=base, out=out, scheme=scheme, quantizer_python=quantizer_python, source=source, work=work)
        else:
            _convert(source=source, identity=identity, work=work, out=out, step=step)
        files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
        manifest = {**identity, "files": files, "prepared_at": time.time(), "seconds": time.monotonic() - start}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        replace_dir(source=out, target=target)
        step(4, f"model ready in {target}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert(
    *, source: gguf_source.GgufSource, identity: dict[str, Any], work: Path, out: Path, step: Callable[[int, str], None]
) -> None:
    from fleetgate.local import conversion

    step(1, f"assembling {source.file_name} ({source.size / 1e6:.0f} MB) from {gguf_source.PACKAGE} "
         f"{source.version} and checking its sha256")
    gguf_path = gguf_source.assemble(source=source, target=work / "gguf" / source.file_name)
    step(2, f"dequantizing the weights to {identity['dtype']} (transformers)")
    conversion.convert_weights(gguf_path=gguf_path, out_dir=out, dtype=identity["dtype"])
    step(3, "converting the tokenizer (adds <bos>, Gemma chat template)")
    conversion.convert_tokenizer(gguf_path=gguf_path, out_dir=out, max_model_len=DEFAULT_MAX_MODEL_LEN)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=Path, help="cache root (default: $FLEETGATE_CACHE or ~/.cache/fleetgate)")
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=("bfloat16", "float32"), help="weight dtype")
    parser.add_argument("--force", action="store_true", help="prepare again even if a valid directory exists")
    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS, help="also quantize the weights (compressed-tensors, for vLLM CPU)"
    )
    parser.add_argument(
        "--quantizer-python", type=Path, help=f"Python with llmcompressor, for w4a16-gptq (${QUANTIZER_PYTHON_ENV})"
    )


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    try:
        path = prepare_model(
            cache_dir=args.cache_dir,
            dtype=args.dtype,
            force=args.force,
            quantization=args.quantization,
            quantizer_python=args.quantizer_python,
        )
    except LocalStackError as exc:
        print(f"fleetgate prepare-model: {exc}", file=sys.stderr)
        return 1
    print(f"{path}  ({time.monotonic() - start:.1f}s)")
    return 0


__all__ = [
    "ModelPrepError",
    "add_arguments",
    "check_prepared",
    "default_cache_dir",
    "model_dir",
    "prepare_lock",
    "prepare_model",
    "read_manifest",
    "replace_dir",
    "run",
]
