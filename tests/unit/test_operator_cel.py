"""The CRD's CEL rules compile and agree with their pydantic twins (evaluated with cel-python).

The API server runs CEL after defaulting, so each case is defaulted from the CRD's own schema first. Agreement
is checked both ways on valid examples and on one variant per rule that must be refused.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from pydantic import ValidationError

from fleetgate.operator.crd import spec_schema
from fleetgate.operator.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _default(value: Any, schema: dict[str, Any]) -> Any:
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    out = dict(value)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = _default(out[name], prop)
    return out


def _rules(value: Any, schema: dict[str, Any], path: str = "spec") -> list[tuple[str, str, bool]]:
    """(path, rule, result) for every CEL rule that applies to `value`."""
    out: list[tuple[str, str, bool]] = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations") or []:
        program = env.program(env.compile(rule["rule"]))
        out.append((path, rule["rule"], bool(program.evaluate({"self": celpy.json_to_cel(value)}))))
    if isinstance(value, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if name in value:
                out += _rules(value[name], prop, f"{path}.{name}")
    return out


def _cel_ok(spec: dict[str, Any]) -> bool:
    schema = spec_schema()
    return all(ok for _p, _r, ok in _rules(_default(spec, schema), schema))


def _pydantic_ok(spec: dict[str, Any]) -> bool:
    try:
        parse_spec(spec)
    except ValidationError:
        return False
    return True


BASE = {"model": {"source": "hf://org/m"}}
REFUSED = [
    {**BASE, "engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}},
    {**BASE, "autoscaling": {"minReplicas": 3, "maxReplicas": 2}, "replicas": 3},
    {**BASE, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
    {**BASE, "replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}},
    {**BASE, "engine": {"speculative": {"method": "eagle3"}}},
    {**BASE, "engine": {"speculative": {"method": "ngram", "draftModel": "x/y"}}},
    {"model": {"source": "hf://org/m", "servedName": "sql"}, "adapters": [{"name": "sql", "source": "/a/sql"}]},
    {**BASE, "adapters": [{"name": "sql", "source": "/a/sql", "rank": 32}]},
    {**BASE, "engine": {"maxLoraRank": 8}, "adapters": [{"name": "sql", "source": "/a/sql", "rank": 16}]},
    {**BASE, "pod": {"labels": {"app.kubernetes.io/instance": "other"}}},
    {**BASE, "pod": {"securityContext": {"seccompProfile": {"type": "Localhost"}}}},
    {**BASE, "engine": {"prefixCaching": False, "kvEvents": {}}},
    {**BASE, "engine": {"kvEvents": {"port": 6000, "replayPort": 6000}}},
    {**BASE, "engine": {"kvEvents": {"port": 8000}}},
]
ACCEPTED = [
    BASE,
    {**BASE, "engine": {"tensorParallelSize": 4}, "resources": {"gpus": 4}},
    {**BASE, "resources": {"accelerator": "cpu", "gpus": 0}},
    {**BASE, "replicas": 0, "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZero": True}},
    {**BASE, "engine": {"speculative": {"method": "ngram", "numTokens": 3}}},
    {**BASE, "adapters": [{"name": "sql", "source": "/a/sql", "rank": 16}, {"name": "legal", "source": "hf://o/l"}]},
    {**BASE, "engine": {"maxLoraRank": 64, "maxAdapters": 2}, "adapters": [{"name": "a", "source": "/a", "rank": 64}]},
    {"model": {"source": "hf://org/m", "servedName": "base"}, "adapters": [{"name": "sql", "source": "/a/sql"}]},
    {**BASE, "pod": {"labels": {"team": "ml"}, "securityContext": {"runAsUser": 2000,
                                                                    "seccompProfile": {"type": "Localhost",
                                                                                       "localhostProfile": "p.json"}}}},
    {**BASE, "engine": {"kvEvents": {}}},
    {**BASE, "engine": {"kvEvents": {"port": 7000, "replayPort": 7001, "topic": "kv@llama"}}},
] + [d["spec"] for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_every_rule_compiles_and_is_exercised() -> None:
    schema = spec_schema()
    seen = {rule for spec in ACCEPTED + REFUSED for _p, rule, _ok in _rules(_default(spec, schema), schema)}
    declared: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        declared.update(r["rule"] for r in node.get("x-kubernetes-validations") or [])
        for prop in (node.get("properties") or {}).values():
            walk(prop)

    walk(schema)
    assert declared and declared <= seen


@pytest.mark.parametrize("spec", ACCEPTED, ids=lambda s: str(s)[:60])
def test_accepted_by_both(spec: dict[str, Any]) -> None:
    assert _pydantic_ok(spec) and _cel_ok(spec)


@pytest.mark.parametrize("spec", REFUSED, ids=lambda s: str(s)[:60])
def test_refused_by_both(spec: dict[str, Any]) -> None:
    assert not _pydantic_ok(spec)
    assert not _cel_ok(spec)


@pytest.mark.parametrize(
    "name", ["qwen", "llama-70b", "a" * 63, "qwen2.5-7b", "a" * 64, "Qwen", "7b-model", "ends-", "under_score"]
)
def test_name_rule_agrees_with_the_operator_check(name: str) -> None:
    """The CRD's root rule on metadata.name refuses exactly the names the operator reports as Invalid."""
    from fleetgate.operator.crd import build_crd
    from fleetgate.operator.names import name_problem

    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rule = next(r for r in root["x-kubernetes-validations"] if r.get("fieldPath") == ".metadata.name")
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    accepted = bool(program.evaluate({"self": celpy.json_to_cel({"metadata": {"name": name}})}))
    assert accepted == (name_problem(name) is None)
    assert accepted == (name in ("qwen", "llama-70b", "a" * 63))


@pytest.mark.parametrize(
    ("served_name", "adapter", "accepted"),
    [(None, "qwen", False), (None, "sql", True), ("base", "qwen", True), ("base", "sql", True)],
)
def test_root_rule_refuses_an_adapter_named_like_the_resource_when_it_is_the_served_name(
    served_name: str | None, adapter: str, accepted: bool
) -> None:
    """Without model.servedName the served model is metadata.name; only a rule on the whole object sees it."""
    from fleetgate.operator.crd import ROOT_RULES

    (rule,) = [r for r in ROOT_RULES if r["fieldPath"] == ".spec.adapters"]
    model: dict[str, Any] = {"source": "hf://org/m", **({"servedName": served_name} if served_name else {})}
    obj = {"metadata": {"name": "qwen"}, "spec": {"model": model, "adapters": [{"name": adapter, "source": "/a"}]}}
    env = celpy.Environment()
    assert bool(env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(obj)})) is accepted
