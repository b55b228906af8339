"""The capacity plan beside every engine log of the second H100 call (docs/reports/data/gpu-h100-call2a.jsonl
and -call2b.jsonl: one device call and a short second one that ran what the first left).

The plan's figures for these configurations were written down before the call (docs/reports/gpu-h100.md,
"Call 2") and nothing was fitted to them: all are held out. Each log is compared with today's plan for the
same spec (`merge.recompare`), so a later change to the plan is judged against what the GPU said.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetgate.bench.gpu.matrix import gpu_matrix
from fleetgate.bench.gpu.merge import load_previous, recompare
from fleetgate.bench.gpu.sweep import Card, profile_for
from fleetgate.operator.profiles import BUILTIN_PROFILES, Profiles

DATA = Path(__file__).resolve().parents[2] / "docs" / "reports" / "data"
HELD_OUT = {"llama8b-draft1b-eager", "gemma3-12b-eager", "llama8b-lora-eager", "llama70b-fp8-tp2-eager",
            "llama8b-ngram-sched-eager", "llama8b-awq-eager"}  # fmt: skip
# vLLM 0.26 loaded this dummy GPTQ checkpoint in 16 bits (it reads the quantized modules from safetensors,
# and a weightless directory has none): a harness artefact, fixed in the shape's config.json, not a plan error.
ARTEFACT = {"qwen7b-gptq-eager"}


def _recompared() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in ("gpu-h100-call2a.jsonl", "gpu-h100-call2b.jsonl"):
        header, records = load_previous(DATA / part)
        profile = profile_for(Card(**header["cards"][0]))
        profiles = Profiles(by_name={**BUILTIN_PROFILES, profile.name: profile}, default=profile.name)
        configs = {c.name: c for c in gpu_matrix(path=lambda s: f"/models/{s}", accelerator=profile.name)}
        measured = {name: r for name, r in records.items()
                    if (r.get("vllm_log") or {}).get("kv_tokens") and name in configs}
        out.update({name: recompare(r, config=configs[name], profiles=profiles) for name, r in measured.items()})
    return out


RECORDS = _recompared()


def test_every_logged_configuration_is_held_out_or_a_known_artefact() -> None:
    assert set(RECORDS) == HELD_OUT | ARTEFACT


@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_plan_within_five_percent_of_the_h100_log(name: str) -> None:
    record = RECORDS[name]
    assert record["plan_recomputed"]
    errors = {k: record["comparison"][k]["error_pct"] for k in ("weights", "kv_tokens", "max_concurrency")}
    assert all(abs(e) <= 5.0 for e in errors.values()), errors


def test_the_gptq_artefact_is_what_sixteen_bit_weights_weigh() -> None:
    """15.76 GiB is Qwen2.5-7B (262,144-token vocabulary) in 16 bits, not 4: the plan was not what failed."""
    record = RECORDS["qwen7b-gptq-eager"]
    assert record["comparison"]["weights"]["vllm"] == 15.76
    params = 28 * (3584 * (3584 + 2 * 512) + 3584 + 2 * 512 + 3584 * 3584 + 3 * 3584 * 18944) + 2 * 262144 * 3584
    assert abs(params * 2 / 2**30 - 15.76) / 15.76 < 0.02
