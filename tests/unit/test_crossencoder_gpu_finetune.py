"""scripts/crossencoder/gpu_finetune.py: the bounded GPU fine-tune of issue 30, run here on CPU with a tiny BERT.

The script is what the GPU machine runs with the little device time it gets, so what must hold is tested here:
every split's held-out rows scored in both modes, determinism across workers, and the deadline (no fit started
past it, a fit running past it abandoned without writing probabilities, exit status 3).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crossencoder" / "gpu_finetune.py"
WORDS = ("how", "do", "i", "sort", "a", "list", "in", "python", "java", "reverse", "order", "quickly", "the",
         "dictionary", "by", "value", "key")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_finetune_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rows() -> list[dict[str, Any]]:
    """Ten rows per source; CV folds by id, -1 outside the CV sources (as `experiment.py export` writes)."""
    sources = ("dev", "train", "frozen", "frozen2", "frozen3", "frozen4")
    rows = []
    for i in range(60):
        source = sources[i // 10]
        a = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(6))
        b = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(5 + i % 3))
        cv = source != "frozen4"
        rows.append({"id": i, "a": a, "b": b, "y": i % 3 == 0, "source": source, "group": i // 2,
                     "cv_group": i // 2 if cv else -1, "cv_fold": (i // 2) % 5 if cv else -1, "above": i % 7 != 3})
    return rows


def _tiny_minilm(folder: Path) -> None:
    """A two-layer BERT with MiniLM's file layout: config.json, model.fp16.safetensors, tokenizer.json."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    vocab = {w: n for n, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128)
    config.to_json_file(str(folder / "config.json"))
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False)
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.fp16.safetensors"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(rows.jsonl, minilm.tar.xz) as `experiment.py prepare` and `pack_minilm.py` write them."""
    root = tmp_path_factory.mktemp("xenc")
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    _tiny_minilm(root / "unpacked" / "all-MiniLM-L6-v2")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root / "unpacked" / "all-MiniLM-L6-v2", arcname="all-MiniLM-L6-v2")
    pack = root / "minilm.tar.xz"
    pack.write_bytes(lzma.compress(buffer.getvalue()))
    return rows, pack


def _run(inputs: tuple[Path, Path], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    rows, pack = inputs
    return subprocess.run([sys.executable, str(SCRIPT), "--rows", str(rows), "--minilm", str(pack), "--out", str(out),
                           "--device", "cpu", "--epochs", "2", "--batch", "8", *extra],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1"})


def _probs(path: Path) -> dict[tuple[str, int], float]:
    return {(r["split"], r["id"]): r["p"] for r in map(json.loads, path.read_text().splitlines())}


def test_both_modes_score_every_held_out_row_of_every_split_whatever_the_worker(
        script: ModuleType, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    one = _run(inputs, tmp_path / "one", "--modes", "full,lora2", "--workers", "1")
    two = _run(inputs, tmp_path / "two", "--modes", "full,lora2", "--workers", "2")
    assert one.returncode == 0, one.stdout + one.stderr
    assert two.returncode == 0, two.stdout + two.stderr
    expected = {(name, i) for name, _, test in script.splits(_rows()) for i in test}
    assert len({name for name, _ in expected}) == 11
    for mode in ("full", "lora2"):
        probs = _probs(tmp_path / "one" / f"probs-gpu-{mode}.jsonl")
        assert set(probs) == expected
        assert all(0.0 < p < 1.0 for p in probs.values())
        other = _probs(tmp_path / "two" / f"probs-gpu-{mode}.jsonl")
        assert other.keys() == probs.keys()  # each fit seeds itself: the worker that ran it does not matter
        assert max(abs(other[k] - probs[k]) for k in probs) < 1e-5
    assert _probs(tmp_path / "one" / "probs-gpu-full.jsonl") != _probs(tmp_path / "one" / "probs-gpu-lora2.jsonl")
    summary = json.loads((tmp_path / "one" / "run.json").read_text())
    assert summary["rows_sha256"] == hashlib.sha256(inputs[0].read_bytes()).hexdigest()
    assert summary["environment"]["device"] == "cpu" and summary["environment"]["torch"] == torch.__version__
    assert [(f["mode"], f["status"], f["epochs_done"]) for f in summary["fits"]] == [
        (m, "done", 2) for _ in range(11) for m in ("full", "lora2")]
    assert "epoch 2/2" in one.stdout and "lora2 lso:frozen4: done" in one.stdout


def test_past_the_deadline_no_fit_starts_and_the_exit_status_says_so(inputs: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    done = _run(inputs, tmp_path / "out", "--modes", "full", "--deadline-s", "0.01", "--only", "cv0,lso:train")
    assert done.returncode == 3, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [(f["split"], f["status"]) for f in summary["fits"]] == [("cv0", "skipped"), ("lso:train", "skipped")]
    assert (tmp_path / "out" / "probs-gpu-full.jsonl").read_text() == ""


def test_a_fit_running_into_the_deadline_is_abandoned(script: ModuleType, inputs: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    tokenizer, base = script.load_minilm(inputs[1], tmp_path)
    rows = _rows()
    tokens = script.Tokens(tokenizer, rows, "cpu")
    y = torch.tensor([float(r["y"]) for r in rows])
    settings = script.Settings(epochs=2, head_lr=1e-3, batch=8, seed=0, device="cpu",
                               started=time.monotonic() - 50.0, deadline=50.0)
    fit = script.Fit(mode="full", split="cv0", train_rows=20, scored=5)
    with pytest.raises(script.DeadlineReached):
        script.run_split(base, tokens, y, list(range(20)), list(range(20, 25)), mode=script.Mode("full", 0, 1e-4),
                         fit=fit, settings=settings, say=lambda line: None)
    assert fit.epochs_done == 0


def test_a_fit_starts_only_if_its_estimate_ends_before_the_deadline(script: ModuleType) -> None:
    done = [script.Fit(mode="full", split="cv0", train_rows=1000, scored=100, status="done", seconds=20.0)]
    assert script.estimate_s([], mode="full", train_rows=1000) is None
    assert script.estimate_s(done, mode="full", train_rows=2000) == pytest.approx(40.0)
    assert script.estimate_s(done, mode="lora8", train_rows=500) == pytest.approx(10.0)  # another mode's rate
    assert script.may_start(elapsed=10.0, estimate=None, deadline=30.0)
    assert not script.may_start(elapsed=30.0, estimate=None, deadline=30.0)
    assert script.may_start(elapsed=10.0, estimate=17.0, deadline=30.0)
    assert not script.may_start(elapsed=10.0, estimate=18.0, deadline=30.0)  # 10 + 1.15 x 18 > 30


def test_modes_are_full_or_a_positive_lora_rank_each_named_once(script: ModuleType) -> None:
    modes = script.parse_modes("full,lora8", full_lr=3e-5, lora_lr=1e-3)
    assert [(m.name, m.lora, m.lr) for m in modes] == [("full", 0, 3e-5), ("lora8", 8, 1e-3)]
    for bad in ("lora0", "lora", "half", "full,full", ""):
        with pytest.raises(SystemExit):
            script.parse_modes(bad, full_lr=3e-5, lora_lr=1e-3)


def test_save_adapters_fits_every_row_above_the_threshold_and_writes_small_float16_adapters(
        inputs: tuple[Path, Path], tmp_path: Path) -> None:
    from safetensors import safe_open

    rows, pack = inputs
    out = tmp_path / "veto.safetensors"
    done = subprocess.run([sys.executable, str(SCRIPT), "--rows", str(rows), "--minilm", str(pack), "--modes", "lora2",
                           "--device", "cpu", "--epochs", "2", "--batch", "8", "--save-adapters", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    with safe_open(str(out), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    assert meta["rows_sha256"] == hashlib.sha256(rows.read_bytes()).hexdigest()
    assert int(meta["train_rows"]) == sum(r["above"] for r in _rows())
    assert json.loads(meta["recipe"])["lr"] == 1e-3 and len(json.loads(meta["losses"])) == 2
    # 2 layers x 6 linear maps x (A, B) + the head's weight and bias, all float16
    assert len(tensors) == 2 * 6 * 2 + 2 and all(t.dtype == torch.float16 for t in tensors.values())
    a, b = tensors["encoder.layer.0.intermediate.dense.lora_a"], tensors["encoder.layer.0.intermediate.dense.lora_b"]
    assert tuple(a.shape) == (2, 16) and tuple(b.shape) == (32, 2)
    assert float(b.abs().sum()) > 0  # B starts at zero: trained
    assert tuple(tensors["head.weight"].shape) == (1, 32)


def test_save_adapters_needs_one_lora_mode(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    rows, pack = inputs
    for modes in ("full", "lora2,lora4"):
        done = subprocess.run([sys.executable, str(SCRIPT), "--rows", str(rows), "--minilm", str(pack), "--modes",
                               modes, "--device", "cpu", "--save-adapters", str(tmp_path / "x.safetensors")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONSAFEPATH": "1"})
        assert done.returncode != 0 and not (tmp_path / "x.safetensors").exists()
