"""Shared pieces of every child manifest: owner, labels, the owner reference and the spec hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fleetgate.engine.kube_names import (
    ANNOTATION_SPEC_HASH,
    API_VERSION,
    ENGINE_NAME,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_ISVC,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    MANAGED_BY,
)


@dataclass(frozen=True, kw_only=True)
class Owner:
    """The InferenceService the children belong to."""

    name: str
    namespace: str
    uid: str
    generation: int = 1

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Owner:
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid", ""),
            generation=meta.get("generation", 1),
        )


def selector_labels(owner: Owner) -> dict[str, str]:
    return {LABEL_NAME: ENGINE_NAME, LABEL_INSTANCE: owner.name}


def labels(owner: Owner) -> dict[str, str]:
    return {
        **selector_labels(owner),
        LABEL_COMPONENT: "engine",
        LABEL_PART_OF: "fleetgate",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_ISVC: owner.name,
    }


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def spec_hash(obj: Any) -> str:
    """A short stable hash of any JSON-able value (sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def child(*, api_version: str, kind: str, owner: Owner, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A child manifest with metadata filled in and the hash of its own content stamped on it."""
    body: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": labels(owner),
            "annotations": {},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": spec,
        **extra,
    }
    body["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = spec_hash(
        {k: v for k, v in body.items() if k != "metadata"}
    )
    return body
