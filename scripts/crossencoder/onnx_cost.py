#!/usr/bin/env python3
"""Issue 30: the CPU price per would-be hit of the cross-encoder veto as the cache would run it (ONNX Runtime, int8).

Round 5 priced the veto's forward pass in numpy float32 (13.8 ms per pair at p50, 4.8x the cache's own int8
embedding of one text). This exports the pair model (the packaged MiniLM over "[CLS] a [SEP] b [SEP]", a, b in
sorted order, at most 96 tokens, and a logistic head on the [CLS] and mean states) to ONNX, quantises it as the
cache's embedder is quantised (`fleetgate.core.minilm_export`: MatMul weights in 8 bits per block of 32,
`accuracy_level=4`), and times both graphs on one thread over round 5's pairs (the first `--pairs` would-be hits
of the CV set, `experiment.py cost`'s), beside the cache's own int8 embedding of one of the two texts in the same
run (the in-run baseline). The weights are the packaged ones (a fine-tuned or adapter-merged encoder has the same
shape, so the same cost); the head is random, so only the pooled states' agreement (cosine, int8 against fp32)
is a fidelity figure. Needs `experiment.py prepare` first; writes `build/xenc/pair-{fp32,int8}.onnx`.

    PYTHONSAFEPATH=1 OMP_NUM_THREADS=1 .venv/bin/python scripts/crossencoder/onnx_cost.py
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "xenc"
PAIR_THRESHOLD = 0.95  # the shipped pair model's threshold (as experiment.py)
MAX_TOKENS = 96


def export_pair(folder: Path, out: Path) -> None:
    """The pair model as an ONNX graph: (input_ids, token_type_ids, attention_mask) -> (logit, pooled states)."""
    import torch
    from transformers import BertModel

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
            torch.manual_seed(0)
            self.head = torch.nn.Linear(2 * self.encoder.config.hidden_size, 1)

        def forward(self, ids: Any, types: Any, mask: Any) -> tuple[Any, Any]:
            h = self.encoder(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = torch.cat([h[:, 0], (h * m).sum(1) / m.sum(1)], dim=1)
            return self.head(pooled).squeeze(-1), pooled

    sample = torch.ones((1, 8), dtype=torch.long)
    axes = {name: {0: "batch", 1: "tokens"} for name in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        torch.onnx.export(Pair(), (sample, torch.zeros_like(sample), sample), str(out),
                          input_names=["input_ids", "token_type_ids", "attention_mask"],
                          output_names=["logit", "pooled"], dynamic_axes={**axes, "logit": {0: "batch"},
                                                                          "pooled": {0: "batch"}},
                          opset_version=17, dynamo=False)


def quantise(source: Path, out: Path) -> None:
    """As `fleetgate.core.minilm_export._quantize_blockwise_int8` (the cache's int8 embedder)."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime").setLevel(logging.WARNING)  # a line per node it leaves alone otherwise
    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), False)


def would_be_hits(count: int) -> list[tuple[str, str]]:
    """The CV set's would-be hits (the pair model's accepts at its threshold), as `experiment.py cost` takes them."""
    with (OUT / "prepared.pkl").open("rb") as f:
        p = pickle.load(f)
    data = p["data"]
    would = np.flatnonzero(p["cv_rows"] & data.candidate & (p["cv_prob"] >= PAIR_THRESHOLD))[:count]
    return [(data.examples[i].a, data.examples[i].b) for i in would]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200)
    args = parser.parse_args()
    from fleetgate.cache.build import build_embedder
    from fleetgate.cache.config import CacheConfig
    from fleetgate.core.minilm import minilm_dir
    from fleetgate.core.minilm_onnx import cpu_session, minilm_tokenizer

    folder = minilm_dir()
    fp32, int8 = OUT / "pair-fp32.onnx", OUT / "pair-int8.onnx"
    if not fp32.is_file():
        export_pair(folder, fp32)
    if not int8.is_file():
        quantise(fp32, int8)
    sessions = {"fp32": cpu_session(str(fp32), threads=1), "int8": cpu_session(str(int8), threads=1)}
    tokenizer = minilm_tokenizer(folder)
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    embedder = build_embedder(CacheConfig()).inner
    embedder.embed(["warm up"])
    pairs = would_be_hits(args.pairs)
    cpu: dict[str, list[float]] = {"fp32": [], "int8": [], "embed": []}
    pooled: dict[str, list[np.ndarray]] = {"fp32": [], "int8": []}
    tokens = []
    for a, b in [("warm", "up"), *pairs]:
        for name, session in sessions.items():
            t = time.process_time()
            enc = tokenizer.encode(*sorted((a, b)))
            feed = {"input_ids": np.array([enc.ids], dtype=np.int64),
                    "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
                    "attention_mask": np.ones((1, len(enc.ids)), dtype=np.int64)}
            _, states = session.run(None, feed)
            cpu[name].append(time.process_time() - t)
            pooled[name].append(np.asarray(states[0], dtype=np.float32))
        t = time.process_time()
        embedder.embed([b])
        cpu["embed"].append(time.process_time() - t)
        tokens.append(len(enc.ids))
    cpu = {k: v[1:] for k, v in cpu.items()}  # the warm-up pair out
    x, q = np.stack(pooled["fp32"][1:]), np.stack(pooled["int8"][1:])
    cosine = (x * q).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(q, axis=1)
    ms = {k: (1e3 * float(np.median(v)), 1e3 * float(np.quantile(v, 0.9))) for k, v in cpu.items()}
    print(f"{len(pairs)} would-be hits, {np.median(tokens[1:]):.0f} tokens a pair at p50 (max {max(tokens)}); "
          f"CPU per pair, one thread, p50 / p90 (tokenizing included):")
    for name, label in (("fp32", "pair model, ONNX fp32"), ("int8", "pair model, ONNX int8 block 32"),
                        ("embed", "baseline: the cache's int8 embedding of one text")):
        print(f"  {label}: {ms[name][0]:.2f} / {ms[name][1]:.2f} ms (p50 ratio to the baseline "
              f"{ms[name][0] / ms['embed'][0]:.2f})")
    print(f"int8 against fp32, pooled states: cosine min {cosine.min():.5f}, p50 {np.median(cosine):.5f}; "
          f"file sizes {fp32.stat().st_size / 2**20:.1f} / {int8.stat().st_size / 2**20:.1f} MiB; "
          f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
