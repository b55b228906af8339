"""`fleetgate plan SPEC.yaml`: the capacity plan and effective engine args for InferenceService files, offline.

Accepts full CRs (`kind: InferenceService`, several per file separated by `---`) or a bare `spec` mapping.
Exit status: 0 when every plan fits, 1 when one does not fit (or has no plan, with `--strict`), 2 on an
invalid file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.engine.args import VLLM_MODULE
from fleetgate.engine.capacity import GB
from fleetgate.operator.profiles import DEFAULT_ACCELERATOR, load_profiles
from fleetgate.operator.resolve import Resolved, resolve
from fleetgate.operator.spec import parse_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, metavar="SPEC.yaml", help="InferenceService manifests")
    parser.add_argument("--profiles", type=Path, help="accelerator profiles YAML (overrides the built-ins)")
    parser.add_argument("--default-accelerator", default=DEFAULT_ACCELERATOR, help="profile for specs without one")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a spec has no capacity plan")


def _documents(path: Path) -> list[tuple[str, Any]]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    out: list[tuple[str, Any]] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "InferenceService":
            out.append((str(doc.get("metadata", {}).get("name", path.stem)), doc.get("spec")))
        elif isinstance(doc, dict) and "model" in doc:
            out.append((path.stem, doc))
    if not out:
        raise ConfigError(f"{path}: no InferenceService (or bare spec with `model`) found")
    return out


def _text(resolved: Resolved) -> str:
    lines = [f"{resolved.name}: {resolved.served_model} on {resolved.profile.name}"]
    plan = resolved.plan
    if plan is not None:
        lines += [
            f"  weights:            {plan.weight_bytes / GB:8.2f} GB, {plan.weight_bytes_per_gpu / GB:.2f} GB per GPU",
            f"  KV per token:       {plan.kv_bytes_per_token:8d} B ({plan.kv_bytes_per_token_per_gpu} B per GPU)",
            f"  KV per sequence:    {plan.kv_bytes_per_sequence / GB:8.2f} GB at max length",
            f"  KV budget per GPU:  {plan.usable_bytes_per_gpu / GB:8.2f} GB",
            f"  KV blocks:          {plan.kv_cache_blocks:8d} of {plan.kv_block_size} tokens per GPU",
            f"  KV cache size:      {plan.kv_cache_tokens:8d} tokens (as vLLM logs it)",
            f"  max concurrency:    {plan.max_concurrency:8.2f}x at max length (as vLLM logs it)",
            f"  max sequences:      {plan.max_concurrent_sequences:8d} at max length",
            f"  fits:               {'yes' if plan.fits else 'NO'}",
        ]
        if plan.activation_bytes_per_gpu is not None:
            graphs, non_torch = plan.cuda_graph_bytes_per_gpu or 0, plan.non_torch_bytes_per_gpu or 0
            lines.insert(
                -6,
                f"  reserve per GPU:    {(plan.reserve_bytes_per_gpu or 0) / GB:8.2f} GB (activations "
                f"{plan.activation_bytes_per_gpu / GB:.2f}, CUDA graphs {graphs / GB:.2f}, non-torch "
                f"{non_torch / GB:.2f}; vLLM logs its own at start-up)",
            )
        if plan.lora_bytes_per_gpu is not None:
            lines.insert(
                -6,
                f"  LoRA slots per GPU: {plan.lora_bytes_per_gpu / GB:8.2f} GB "
                f"({plan.max_adapters} adapters x rank {plan.max_lora_rank})",
            )
    lines.append(f"  {resolved.plan_note}")
    argv = ["python3", "-m", VLLM_MODULE, *resolved.engine_args.to_argv()]
    lines.append(f"  engine: {shlex.join(argv)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    profiles = load_profiles(path=args.profiles, default=args.default_accelerator)
    status = 0
    results: list[dict[str, Any]] = []
    for path in args.files:
        for name, raw in _documents(path):
            try:
                resolved = resolve(spec=parse_spec(raw), name=name, profiles=profiles)
            except ValidationError as exc:
                raise ConfigError(f"{path}: {name}: invalid spec:\n{exc}") from None
            except ConfigError as exc:
                raise ConfigError(f"{path}: {name}: {exc}") from None
            plan = resolved.plan
            if (plan is not None and not plan.fits) or (plan is None and args.strict):
                status = 1
            if args.json:
                results.append(
                    {
                        "name": name,
                        "accelerator": resolved.profile.name,
                        "plan": plan.to_status() if plan else None,
                        "note": resolved.plan_note,
                        "engineArgs": resolved.engine_args.to_argv(),
                    }
                )
            else:
                print(_text(resolved))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    return status
