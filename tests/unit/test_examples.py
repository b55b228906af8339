"""Every examples/*.yaml InferenceService passes the CRD's OpenAPI schema and the typed spec, and plans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetgate.operator.crd import build_crd
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.spec import parse_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "InferenceService"]


def test_there_are_the_documented_examples() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"small-l4-awq", "llama-70b-h100-tp4", "speculative-llama-8b", "does-not-fit"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_valid(path: Path) -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    docs = _docs(path)
    assert docs, f"{path} holds no InferenceService"
    for doc in docs:
        jsonschema.Draft4Validator(schema).validate(doc)
        assert doc["apiVersion"] == "fleetgate.io/v1alpha1"
        # `kubectl apply -n <ns> -f` must work: a hard-coded namespace would clash with the operator's scope.
        assert "namespace" not in doc["metadata"], f"{path.name}: no metadata.namespace in examples"
        parse_spec(doc["spec"])


def _plan(stem: str) -> Any:
    (doc,) = _docs(next(p for p in EXAMPLES if p.stem == stem))
    return resolve(spec=parse_spec(doc["spec"]), name=doc["metadata"]["name"], profiles=Profiles())


def test_examples_that_should_fit_fit() -> None:
    for stem in ("small-l4-awq", "llama-70b-h100-tp4", "speculative-llama-8b"):
        resolved = _plan(stem)
        assert resolved.plan is not None and resolved.plan.fits and resolved.plan.meets_target, stem


def test_does_not_fit_example_does_not_fit() -> None:
    resolved = _plan("does-not-fit")
    assert resolved.plan is not None and not resolved.plan.fits
    assert "weights do not fit" in resolved.plan.reason


def test_70b_example_uses_tp4_and_fp8_kv() -> None:
    argv = _plan("llama-70b-h100-tp4").engine_args.to_argv()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"


def test_lora_example_plans_its_adapter_slots() -> None:
    resolved = _plan("lora-llama-8b-adapters")
    plan = resolved.plan
    assert plan is not None and plan.fits and plan.meets_target
    assert (plan.max_adapters, plan.max_lora_rank) == (4, 32)
    # 4 slots x rank 32 x hidden 4096 x (A + B) x 32 layers x 7 modules x 2 bytes
    assert plan.lora_bytes_per_gpu == 4 * 32 * 4096 * 2 * 32 * 7 * 2
    assert [a.name for a in resolved.adapters] == ["sql-assistant", "legal-summaries"]
