"""LoRA adapters in the gateway config and static discovery: validation, endpoints, `/v1/models`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from fleetgate.core.adapters import AdapterSpec
from fleetgate.core.config import load_model
from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint
from fleetgate.gateway.discovery import (
    AdapterCatalog,
    ModelListing,
    StaticEndpointSource,
    adapter_named,
    models_page,
    served_names,
)
from fleetgate.gateway.settings import GatewaySettings

CONFIG = """
models:
  - name: base
    endpoints: ['http://10.0.0.1:8000', 'http://10.0.0.2:8000']
    served_name: org/base
    adapters:
      - {name: legal, source: /adapters/legal, rank: 8}
      - {name: pirate, source: /adapters/pirate, tenants: [acme]}
  - name: idle
    endpoints: []
    adapters:
      - {name: idle-ft, source: /adapters/idle}
"""


def _settings(tmp_path: Path, text: str = CONFIG) -> GatewaySettings:
    f = tmp_path / "gw.yaml"
    f.write_text(text)
    return load_model(GatewaySettings, f)


def _page(source: object, **kw: object) -> dict[str, dict[str, object]]:
    body = orjson.loads(models_page(source, aliases=[], **kw))  # type: ignore[arg-type]
    return {m["id"]: m for m in body["data"]}


def test_adapters_are_served_on_their_base_endpoints(tmp_path: Path) -> None:
    source = StaticEndpointSource(_settings(tmp_path).models)
    assert isinstance(source, AdapterCatalog)
    assert source.models() == ["base", "idle"]  # models() stays the base models
    assert served_names(source) == ["base", "idle", "legal", "pirate", "idle-ft"]
    assert source.endpoints("legal") == source.endpoints("base")
    assert [e.id for e in source.endpoints("pirate")] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert source.endpoints("idle-ft") == []
    legal = adapter_named(source, "legal")
    assert legal == AdapterSpec(name="legal", base="base", source="/adapters/legal", rank=8)
    assert adapter_named(source, "pirate") is not None and adapter_named(source, "pirate").tenants == {"acme"}  # type: ignore[union-attr]
    assert adapter_named(source, "base") is None and adapter_named(source, "nope") is None


def test_models_page_lists_servable_adapters_with_their_parent(tmp_path: Path) -> None:
    source = StaticEndpointSource(_settings(tmp_path).models)
    page = _page(source, allowed=None, tenant="acme")
    assert page["legal"]["parent"] == "base" and page["pirate"]["parent"] == "base"
    assert "parent" not in page["base"]
    assert "idle-ft" not in page  # its base has no endpoint and cannot be woken: not servable
    assert page["idle"]["fleetgate"] == {"ready": False, "scaled_to_zero": False}  # a base stays as it was
    assert page["legal"]["fleetgate"] == {"ready": True, "scaled_to_zero": False}


def test_models_page_applies_tenant_lists_and_adapter_tenants(tmp_path: Path) -> None:
    source = StaticEndpointSource(_settings(tmp_path).models)
    # the tenant's models list governs adapters like models
    assert set(_page(source, allowed=frozenset({"base", "legal"}), tenant="acme")) == {"base", "legal"}
    # an adapter restricted to other tenants is hidden even when the models list names it
    assert set(_page(source, allowed=frozenset({"pirate", "legal"}), tenant="other")) == {"legal"}
    assert set(_page(source, allowed=None, tenant="other")) == {"base", "idle", "legal"}
    assert set(_page(source, allowed=None, tenant=None)) == {"base", "idle", "legal"}


class _ListingSource:
    """A discovery that lists its models itself (like Kubernetes), with a wakeable base and adapters."""

    def models(self) -> list[str]:
        return ["sleepy", "sleepy-ft"]  # tolerates a source that lists adapters among its models too

    def endpoints(self, model: str) -> list[Endpoint]:
        return []

    def listing(self) -> list[ModelListing]:
        return [
            ModelListing(name="sleepy", ready=False, scaled_to_zero=True),
            ModelListing(name="sleepy-ft", ready=False),
        ]

    def adapters(self) -> list[AdapterSpec]:
        return [
            AdapterSpec(name="sleepy-ft", base="sleepy", source="/a"),
            AdapterSpec(name="orphan", base="gone", source="/b"),
        ]


def test_adapter_of_a_wakeable_base_is_listed_scaled_to_zero_once() -> None:
    source = _ListingSource()
    body = orjson.loads(models_page(source, aliases=["auto"], allowed=None))  # type: ignore[arg-type]
    ids = [m["id"] for m in body["data"]]
    assert ids == ["sleepy", "sleepy-ft", "auto"]  # once each; the orphan's base is not offered
    ft = body["data"][1]
    assert ft["parent"] == "sleepy" and ft["fleetgate"] == {"ready": False, "scaled_to_zero": True}
    assert served_names(source) == ["sleepy", "sleepy-ft", "orphan"]  # type: ignore[arg-type]


class _StartingSource(_ListingSource):
    """A wakeable base whose pods are starting (replicas > 0, none ready yet): not scaled to zero."""

    def listing(self) -> list[ModelListing]:
        return [ModelListing(name="sleepy", ready=False, wakeable=True)]


def test_adapter_of_a_starting_base_is_listed_and_neither_is_called_scaled_to_zero() -> None:
    body = orjson.loads(models_page(_StartingSource(), aliases=[], allowed=None))  # type: ignore[arg-type]
    assert [(m["id"], m["fleetgate"]) for m in body["data"]] == [
        ("sleepy", {"ready": False, "scaled_to_zero": False}),
        ("sleepy-ft", {"ready": False, "scaled_to_zero": False}),
    ]


@pytest.mark.parametrize(
    ("adapters", "where"),
    [
        ("[{name: Legal, source: /a}]", "adapter name 'Legal' is not valid"),
        ("[{name: 'legal adapter', source: /a}]", "is not valid"),
        ("[{name: '-x', source: /a}]", "is not valid"),
        ('[{name: "legal\\n", source: /a}]', "is not valid"),  # a trailing newline (Python's `$` allowed it)
        (f"[{{name: {'a' * 64}, source: /a}}]", "at most 63"),
        ("[{name: legal}]", "source"),
        ("[{name: legal, source: ''}]", "source"),
        ("[{name: legal, source: /a, rank: 0}]", "rank"),
        ("[{name: legal, source: /a, weight: 3}]", "weight"),
        ("[{name: base, source: /a}]", "repeated: base"),
        ("[{name: legal, source: /a}, {name: legal, source: /b}]", "repeated: legal"),
    ],
)
def test_bad_adapters_are_clear_config_errors(tmp_path: Path, adapters: str, where: str) -> None:
    text = f"models:\n  - name: base\n    endpoints: []\n    adapters: {adapters}\n"
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, text)
    assert where in str(info.value)


def test_adapter_names_are_unique_across_models(tmp_path: Path) -> None:
    text = (
        "models:\n  - name: a\n    adapters: [{name: b-ft, source: /x}]\n"
        "  - name: b\n    adapters: [{name: b-ft, source: /y}]\n"
    )
    with pytest.raises(ConfigError, match="repeated: b-ft"):
        _settings(tmp_path, text)
    with pytest.raises(ConfigError, match="repeated: a"):
        _settings(tmp_path, "models:\n  - name: a\n  - name: b\n    adapters: [{name: a, source: /y}]\n")


def test_adapter_load_timeout_setting(tmp_path: Path) -> None:
    assert _settings(tmp_path, "{}").server.adapter_load_timeout_s == 30.0
    assert _settings(tmp_path, "server: {adapter_load_timeout_s: 2.5}\n").server.adapter_load_timeout_s == 2.5
    with pytest.raises(ConfigError, match="adapter_load_timeout_s"):
        _settings(tmp_path, "server: {adapter_load_timeout_s: 0}\n")
