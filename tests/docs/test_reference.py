"""The generated reference pages: current, complete, and built from what the code really registers."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fleetgate.docsgen import pages

from .conftest import REPO

REFERENCE = REPO / "docs" / "reference"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return {name: pages.generate(name) for name in pages.PAGES}


def test_committed_reference_pages_are_current(generated: dict[str, str]) -> None:
    stale = [n for n, text in generated.items() if (REFERENCE / n).read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated references {stale}: run `make docs-ref` and commit docs/reference/"


def test_a_changed_page_is_reported_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          generated: dict[str, str]) -> None:
    for name, text in generated.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(pages, "REFERENCE", tmp_path)
    monkeypatch.setattr(pages, "generate", lambda name: generated[name])
    assert pages.stale() == []
    (tmp_path / "cli.md").write_text(generated["cli.md"].replace("fleetgate up", "fleetgate upp", 1))
    (tmp_path / "metrics.md").unlink()
    assert pages.stale() == ["cli.md", "metrics.md"]
    assert pages.main(["--check"]) == 1


def _rows(text: str) -> dict[str, list[str]]:
    """First-column code span -> the row's cells, for every table row of a page."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"^\| `([^`]+)`(?: \(default\))? \| (.*) \|$", line)
        if match:
            out[match.group(1)] = [c.strip() for c in match.group(2).split(" | ")]
    return out


def _members(*annotations: Any) -> list[Any]:
    """The types an annotation can hold: `Annotated` unwrapped, unions split."""
    out = []
    for a in annotations:
        while typing.get_origin(a) is typing.Annotated:
            a = typing.get_args(a)[0]
        if typing.get_origin(a) in (typing.Union, types.UnionType):
            out += _members(*typing.get_args(a))
        else:
            out.append(a)
    return out


def _walk(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, default or None for required) of every field, found without the generator's code."""
    out = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{info.alias or name}"
        annotation = info.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
        inner = typing.get_args(args[0]) if typing.get_origin(args[0]) in (list, dict) else ()
        models = [a for a in _members(*args, *inner[-1:]) if isinstance(a, type) and issubclass(a, BaseModel)]
        if typing.get_origin(args[0]) is list and models:
            key += "[]"
        elif typing.get_origin(args[0]) is dict and models:
            key += ".<name>"
        default = None if info.is_required() else (info.default_factory() if info.default_factory  # type: ignore[call-arg]
                                                   else info.default)
        out.append((key, default))
        for sub in models:
            if len(models) == 1:
                out += _walk(sub, key + ".")
            else:
                out += _walk(sub, f"{key} ({sub.__name__}).")
    return out


def _default_cell(default: Any) -> str | None:
    """How the page must show a scalar default (None: not a scalar, checked elsewhere)."""
    if isinstance(default, (bool, int, float, str)) and not isinstance(default, BaseModel):
        return f"`{json.dumps(default)}`"
    return None


@pytest.mark.parametrize(("model_path", "page"), [("fleetgate.gateway.settings:GatewaySettings", "gateway-config.md"),
                                                  ("fleetgate.local.config:UpConfig", "up-config.md")])
def test_every_configuration_key_appears_with_its_default(model_path: str, page: str,
                                                          generated: dict[str, str]) -> None:
    import importlib

    module, attr = model_path.split(":")
    rows = _rows(generated[page])
    keys = _walk(getattr(importlib.import_module(module), attr))
    assert len(keys) > 50
    for key, default in keys:
        assert key in rows, f"{page}: no row for {key}"
        cell = _default_cell(default)
        if cell is not None:
            assert rows[key][1] == cell, f"{page}: {key} shows default {rows[key][1]}, the model says {cell}"
        elif default is None:
            assert rows[key][1] in ("required", "unset (null)", "—"), (key, rows[key][1])


def test_every_crd_field_appears_with_its_default_and_validation(generated: dict[str, str]) -> None:
    from fleetgate.operator.crd import spec_schema

    rows = _rows(generated["inferenceservice.md"])
    seen = 0

    def walk(node: dict[str, Any], path: str) -> None:
        nonlocal seen
        for name, child in node.get("properties", {}).items():
            full = f"{path}.{name}"
            assert full in rows, f"no row for {full}"
            seen += 1
            if "default" in child:
                assert rows[full][1] == f"`{json.dumps(child['default'])}`", (full, rows[full][1])
            for bound in ("maximum", "maxLength", "maxItems"):
                if bound in child:
                    assert str(child[bound]) in rows[full][2], (full, bound)
            walk(child, full)
            walk(child.get("items", {}), f"{full}[]")

    walk(spec_schema(), "spec")
    assert seen > 60


def test_the_capacity_plan_guide_explains_every_status_key() -> None:
    from fleetgate.docsgen.crd_ref import sample_status

    guide = (REPO / "docs" / "guides" / "capacity-plan.md").read_text()
    explained = set(re.findall(r"`(\w+)`", "\n".join(line for line in guide.splitlines() if line.startswith("| `"))))
    missing = sorted(set(sample_status()["capacityPlan"]) - explained)
    assert not missing, f"docs/guides/capacity-plan.md does not explain status.capacityPlan keys {missing}"


def test_every_command_and_benchmark_has_a_section(generated: dict[str, str]) -> None:
    from fleetgate import cli
    from fleetgate.bench.cli import BENCHMARKS

    headings = set(re.findall(r"^#+ `([^`]+)`$", generated["cli.md"], re.M))
    assert {f"fleetgate {c}" for c in cli.COMMANDS} <= headings
    assert {f"fleetgate bench {b}" for b in BENCHMARKS} <= headings
    assert {"fleetgate tier train", "fleetgate tier calibrate", "fleetgate tier eval"} <= headings
    assert "--max-tokens MAX_TOKENS" in generated["cli.md"]  # options, not only commands


def test_every_helm_value_appears_with_its_default(generated: dict[str, str]) -> None:
    import yaml

    from fleetgate.docsgen.helm_ref import all_keys

    rows = _rows(generated["helm-values.md"])
    values = yaml.safe_load((REPO / "charts" / "fleetgate" / "values.yaml").read_text())
    keys = all_keys()
    assert len(keys) > 80
    for key in keys:
        assert key in rows, key
        node: Any = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, (bool, int, float, str)):
            assert rows[key][1] == f"`{json.dumps(node)}`", (key, rows[key][1])


def test_the_metrics_reference_covers_every_family_a_full_gateway_registers(generated: dict[str, str]) -> None:
    """A gateway with caching, tiers, tenants, prices and adapters on: every family in its registry is listed."""
    from prometheus_client import CollectorRegistry

    from fleetgate.core.kvstore import MemoryKVStore
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.settings import GatewaySettings

    settings = GatewaySettings.model_validate({
        "server": {"metrics_port": None},
        "models": [{"name": "small", "endpoints": ["http://127.0.0.1:9"],
                    "adapters": [{"name": "ft-a", "source": "/a"}]},
                   {"name": "large", "endpoints": ["http://127.0.0.1:9"]}],
        "cache": {"enabled": True, "semantic": {"embedder": "hashing"}},
        "tiers": {"aliases": {"auto": {"tiers": [{"name": "s", "model": "small"}, {"name": "l", "model": "large"}]}}},
        "tenancy": {"prices": {"small": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"},
                               "large": {"kind": "gpu", "gpu_type": "H100", "gpu_count": 1, "usd_per_gpu_hour": "2",
                                         "fallback_tokens_per_hour": 1000000}},
                    "tenants": [{"id": "t", "daily_budget_usd": "1"}]},
    })
    registry = CollectorRegistry()
    create_app(settings, registry=registry, kvstore=MemoryKVStore())
    families = {m.name for m in registry.collect()}
    names = re.findall(r"^\| `([a-z_:]+)` \|", generated["metrics.md"], re.M)
    documented = {*names, *(n.removesuffix("_total") for n in names), *(n.removesuffix("_info") for n in names)}
    assert len(families) > 30
    assert families <= documented, f"registered but not in the metrics reference: {sorted(families - documented)}"
