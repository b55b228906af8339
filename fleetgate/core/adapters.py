"""LoRA adapters: the value types every part shares (operator, gateway, router, simulator, local stack).

An adapter is a model name clients can ask for. It runs on the endpoints of its `base` model: vLLM loads
LoRA weights next to the base weights (`--enable-lora`) and answers requests whose `model` is the adapter's
name with them. So the gateway routes an adapter request to an endpoint of the base model, preferring one
that has the adapter loaded already, and accounts it under the adapter's own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A DNS-1123 label-like name: it is a model name on the wire, a Prometheus label value, a ledger field and
# (in the operator) part of Kubernetes object names, so it stays short and plain.
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"
ADAPTER_NAME_MAX = 63
_NAME = re.compile(ADAPTER_NAME_PATTERN)


def valid_adapter_name(name: str) -> bool:
    # fullmatch: the pattern's `$` (kept for the CRD's schema) also matches before a trailing newline in Python.
    return len(name) <= ADAPTER_NAME_MAX and bool(_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterSpec:
    """One LoRA adapter served on a base model."""

    name: str  # the model name clients send; unique across models and adapters
    base: str  # the base model's served name: the adapter runs on its endpoints
    source: str  # what the engine loads (`lora_path` of vLLM's load API): a path the engine can read
    rank: int | None = None  # LoRA rank r, when known (capacity plan, validation against maxLoraRank)
    tenants: frozenset[str] = field(default_factory=frozenset)  # empty: every tenant whose models allow it


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedAdapter:
    """An adapter an engine reports as loaded (vLLM's `/v1/models` lists it with `parent` = base)."""

    name: str
    base: str | None
    source: str | None
