"""The pair model's training for `gpu_finetune.py`: MiniLM as a cross-encoder over "[CLS] a [SEP] b [SEP]", every
weight or rank-R adapters (LoRA) trained with a logistic head, one fit per (mode, split), and the adapters as the
cache ships them. Torch, transformers, tokenizers and safetensors only (no fleetgate: it runs on the GPU machine as
it is); imported lazily inside the functions so that `gpu_finetune.py` plans and checks its deadline before torch's
import.
"""

from __future__ import annotations

import lzma
import math
import random
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CV_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3")
LSO_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3", "frozen4")
MAX_TOKENS = 96
MODEL_FOLDER = "all-MiniLM-L6-v2"

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
