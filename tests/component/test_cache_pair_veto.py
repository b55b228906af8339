"""The shipped pair veto (`cache/data/pair_veto_lora8.safetensors` merged into the packaged MiniLM, int8 ONNX).

What must hold for the file the cache ships: the int8 graph gives the probabilities of the model as it was
trained (adapters beside the frozen weights, float32 torch: `gpu_finetune.py`'s formulation, not the merge's),
it is symmetric, and it refuses an added constraint while it passes a paraphrase (hand-written pairs, in no
evaluation set). The ONNX file is exported on first use into the model folder when missing (seconds).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fleetgate.cache.pairveto import ADAPTERS, MAX_TOKENS, default_scorer

pytestmark = pytest.mark.slow

PARAPHRASES = [
    ("How do I reverse a list in Python without copying it?",
     "What's the way to reverse a Python list in place, without making a copy?"),
    ("What is the capital of Australia?", "Which city is Australia's capital?"),
    ("How do I reset my router?", "Sorry if this is basic, but how do I reset my router?"),
]
CONSTRAINTS = [
    ("Write a short story about a lighthouse keeper.",
     "Write a short story about a lighthouse keeper, told only in dialogue."),
    ("How do I host a static website?", "How do I host a static website using only the free tier?"),
    ("Describe the Eiffel Tower.", "Describe the Eiffel Tower without any visual details."),
]


def _trained_formulation(pairs: list[tuple[str, str]]) -> list[float]:
    """The probabilities as `gpu_finetune.py` computes them in training: float32 torch, x W^T + (x A^T) B^T."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from transformers import AutoModel

    from fleetgate.core.minilm import minilm_dir
    from fleetgate.core.minilm_onnx import minilm_tokenizer

    folder = minilm_dir()
    tensors = {k: v.float() for k, v in load_file(str(ADAPTERS)).items()}
    model = AutoModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    modules = dict(model.named_modules())
    for key in [k for k in tensors if k.endswith(".lora_a")]:
        linear = modules[key.removesuffix(".lora_a")]
        a, b = tensors[key], tensors[key.removesuffix("_a") + "_b"]
        linear.register_forward_hook(lambda _m, inputs, out, a=a, b=b: out + (inputs[0] @ a.T) @ b.T)
    tokenizer = minilm_tokenizer(folder)
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    out = []
    with torch.no_grad():
        for x, y in pairs:
            enc = tokenizer.encode(*sorted((x, y)))
            ids = torch.tensor([enc.ids])
            h = model(input_ids=ids, token_type_ids=torch.tensor([enc.type_ids]),
                      attention_mask=torch.ones_like(ids)).last_hidden_state
            pooled = torch.cat([h[:, 0], h.mean(1)], dim=1)
            logit = pooled @ tensors["head.weight"].T + tensors["head.bias"]
            out.append(1.0 / (1.0 + math.exp(-float(logit[0, 0]))))
    return out


def test_the_int8_graph_gives_the_trained_models_probabilities() -> None:
    scorer = default_scorer()
    pairs = PARAPHRASES + CONSTRAINTS
    shipped = [scorer.probability(a, b) for a, b in pairs]
    trained = _trained_formulation(pairs)
    for got, want in zip(shipped, trained, strict=True):
        assert abs(got - want) < 0.03, (shipped, trained)


def test_it_is_symmetric_and_refuses_constraints_while_passing_paraphrases() -> None:
    scorer = default_scorer()
    threshold = 0.2  # the shipped `semantic.pair_veto.threshold`
    for a, b in PARAPHRASES:
        assert scorer.probability(a, b) >= threshold, (a, b)
    for a, b in CONSTRAINTS:
        assert scorer.probability(a, b) < threshold, (a, b)
        assert scorer.probability(a, b) == scorer.probability(b, a)


def test_a_prompt_past_96_tokens_is_cut_the_cost_stays_bounded_and_an_added_constraint_there_is_unseen() -> None:
    scorer = default_scorer()
    body = "Summarise the following text. " + "The quarterly report shows revenue growth in every region. " * 40
    plain = scorer.probability(body, body + " Answer in French.")  # the addition lies past token 96 on both sides
    assert 0.0 <= plain <= 1.0
    # past the cut both inputs read the same: the veto cannot refuse on what it does not see (it can only let
    # the pair model's decision stand), and the pair is scored as a whole prompt equal to itself
    assert abs(plain - scorer.probability(body, body)) < 1e-6


def test_a_failed_export_is_a_clear_error_and_leaves_no_partial_file(tmp_path: Path) -> None:
    from fleetgate.core.errors import ConfigError
    from fleetgate.core.minilm_export import ensure_pair_veto, pair_veto_file

    (tmp_path / "config.json").write_text("{}")  # a model folder without weights: the export must fail
    with pytest.raises(ConfigError, match=r"exporting the pair veto to ONNX failed"):
        ensure_pair_veto(model_dir=tmp_path, adapters=ADAPTERS)
    assert not pair_veto_file(model_dir=tmp_path, adapters=ADAPTERS).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # temporaries cleaned up
