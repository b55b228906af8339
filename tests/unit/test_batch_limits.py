"""The batch limits vLLM runs with, and the spec it refuses: maxNumSeqs above one step's token budget.

vLLM 0.26 (GPU) and 0.32 (CPU) both refuse `max_num_batched_tokens < max_num_seqs`
(`SchedulerConfig.verify_max_model_len`); with only maxNumSeqs set, the step budget is vLLM's default for
the accelerator (8192 on an H100, 2048 on an L4 or vLLM CPU). The operator used to accept such a spec and
make pods that crash-loop; it now refuses it with an Invalid status.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.engine.batch_limits import BatchLimits, batch_problem, effective_limits
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import batch_limits, resolve
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status


def _spec(accelerator: str, **engine: Any) -> Any:
    gpus = 0 if accelerator == "cpu" else 1
    return parse_spec({"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "engine": engine,
                       "resources": {"accelerator": accelerator, "gpus": gpus}})  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, BatchLimits(max_num_batched_tokens=8192, max_num_seqs=1024)),
        ({"max_num_seqs": 64}, BatchLimits(max_num_batched_tokens=8192, max_num_seqs=64)),
        ({"max_num_seqs": 2, "max_model_len": 1024}, BatchLimits(max_num_batched_tokens=2048, max_num_seqs=2)),
        (
            {"chunked_prefill": False, "max_model_len": 32768},
            BatchLimits(max_num_batched_tokens=32768, max_num_seqs=1024),
        ),
        ({"max_num_batched_tokens": 512}, BatchLimits(max_num_batched_tokens=512, max_num_seqs=512)),
    ],
)
def test_effective_limits_follow_vllm_defaults(kwargs: dict[str, Any], expected: BatchLimits) -> None:
    args = {"max_num_seqs": None, "max_num_batched_tokens": None, "chunked_prefill": None, "max_model_len": 8192,
            "default_seqs": 1024, "default_tokens": 8192, **kwargs}  # fmt: skip
    assert effective_limits(**args) == expected


def test_problem_names_the_fix() -> None:
    assert batch_problem(BatchLimits(max_num_batched_tokens=8192, max_num_seqs=8192)) is None
    problem = batch_problem(BatchLimits(max_num_batched_tokens=8192, max_num_seqs=16384))
    assert problem is not None and "maxNumBatchedTokens to at least 16384" in problem


@pytest.mark.parametrize(("accelerator", "seqs"), [("nvidia-h100-80gb", 16384), ("nvidia-l4", 4096), ("cpu", 4096)])
def test_operator_refuses_what_vllm_refuses(accelerator: str, seqs: int) -> None:
    spec = _spec(accelerator, maxNumSeqs=seqs)
    with pytest.raises(ConfigError, match=f"maxNumSeqs {seqs} exceeds"):
        resolve(spec=spec, name="llama", profiles=Profiles())


def test_refusal_becomes_an_invalid_status() -> None:
    try:
        resolve(spec=_spec("nvidia-l4", maxNumSeqs=4096), name="llama", profiles=Profiles())
    except ConfigError as exc:
        message = str(exc)
    status = compute_status(owner=Owner(name="llama", namespace="ns", uid="u"), spec=None, resolved=None,
                            invalid=message, deployment=None, previous=None, now=dt.datetime.now(dt.UTC))  # fmt: skip
    assert status["phase"] == "Invalid"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec") and "maxNumSeqs" in degraded["message"]


def test_a_large_budget_makes_it_valid_and_the_plan_uses_the_effective_limits() -> None:
    spec = _spec("nvidia-l4", maxNumSeqs=4096, maxNumBatchedTokens=4096)
    assert resolve(spec=spec, name="llama", profiles=Profiles()).plan is not None
    limits = batch_limits(spec=_spec("nvidia-h100-80gb"), profile=Profiles().resolve(name="nvidia-h100-80gb"))
    assert limits == BatchLimits(max_num_batched_tokens=8192, max_num_seqs=1024)
