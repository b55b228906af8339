"""Other InferenceServices in the namespace that serve the same model name. Pure.

The gateway routes by served model name and merges the pods of every InferenceService that serves it, so
two services with one name share their traffic: on purpose for two pools of one model (an L4 and an H100
pool), by mistake when the models differ. Either way it is worth saying: the condition ServedModelUnique
is False (SharedModelName) naming the others, and those serving it from another model source are marked,
because then clients get answers from different models under one name. One namespace only: the
gateway's discovery and the operator's namespaced RBAC see one namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def served_model_of(obj: Mapping[str, Any]) -> str:
    """The name clients send for an InferenceService (its status, else its spec, else its name)."""
    spec = obj.get("spec") or {}
    name = str((obj.get("metadata") or {}).get("name", ""))
    return str((obj.get("status") or {}).get("servedModel") or (spec.get("model") or {}).get("servedName") or name)


def shared_with(*, name: str, served: str, source: str, others: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The other services serving `served`, by name, each marked when its model source differs."""
    out = []
    for other in others:
        meta = other.get("metadata") or {}
        if meta.get("name") == name or meta.get("deletionTimestamp") or served_model_of(other) != served:
            continue
        theirs = ((other.get("spec") or {}).get("model") or {}).get("source")
        out.append(str(meta.get("name")) + ("" if theirs == source else f" (another source: {theirs})"))
    return tuple(sorted(out))
