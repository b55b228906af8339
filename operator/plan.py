"""The reconcile plan: what to change so that what is observed becomes what is desired. Pure.

Inputs: desired child manifests (from the builders), observed children (from the API, found by label),
the owner's uid, and `hold`: kinds that must be neither created, updated nor deleted this time (a spec that
does not fit holds the Deployment and its autoscaler: no new pods that would crash-loop, and an engine that
already serves keeps serving). Per child, keyed by (kind, name):
- desired, not observed             -> create
- desired, observed, same spec hash, owned fields as desired -> keep (no API call)
- desired, observed, same spec hash, an owned field changed  -> update, `drift` naming the fields
  (someone edited the child: `kubectl scale`, `set image`, `patch svc`; see `fleetgate.operator.drift`)
- desired, observed, other hash     -> update
- observed, owned by us, not desired -> delete (e.g. the HPA after autoscaling was removed)
- desired, observed, another controller's -> conflict (never taken over; reported as Degraded)
Observed objects that another controller owns are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fleetgate.engine.kube_names import ANNOTATION_SPEC_HASH
from fleetgate.operator.drift import drift

Verb = Literal["create", "update", "keep", "delete", "hold", "conflict"]
POD_KINDS: frozenset[str] = frozenset({"Deployment", "HorizontalPodAutoscaler", "ScaledObject", "PodDisruptionBudget"})
# Held while a spec does not fit: no pods, and no Service for them either (an engine of an earlier spec that
# still serves keeps its Service, since held children are not deleted).
UNFIT_HOLD: frozenset[str] = POD_KINDS | {"Service", "ServiceMonitor"}


@dataclass(frozen=True, kw_only=True)
class Action:
    verb: Verb
    kind: str
    name: str
    manifest: dict[str, Any] | None = None
    drift: tuple[str, ...] = ()  # an update that puts back edited fields: "path (was value)" each

    @property
    def mutates(self) -> bool:
        return self.verb in ("create", "update", "delete")


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def spec_hash_of(obj: dict[str, Any]) -> str | None:
    value = (obj.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    return value if isinstance(value, str) else None


def owned_by(obj: dict[str, Any], *, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def _controlled_by_other(obj: dict[str, Any], *, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") != uid for ref in refs)


def plan(
    *,
    desired: list[dict[str, Any]],
    observed: list[dict[str, Any]],
    owner_uid: str,
    hold: frozenset[str] = frozenset(),
) -> list[Action]:
    seen = {_key(o): o for o in observed}
    wanted = {_key(d) for d in desired}
    actions: list[Action] = []
    for manifest in desired:
        kind, name = _key(manifest)
        current = seen.get((kind, name))
        if kind in hold:
            actions.append(Action(verb="hold", kind=kind, name=name))
        elif current is None:
            actions.append(Action(verb="create", kind=kind, name=name, manifest=manifest))
        elif _controlled_by_other(current, uid=owner_uid):
            actions.append(Action(verb="conflict", kind=kind, name=name))
        elif spec_hash_of(current) == spec_hash_of(manifest) and owned_by(current, uid=owner_uid):
            changed = tuple(d.describe() for d in drift(desired=manifest, live=current))
            if changed:
                actions.append(Action(verb="update", kind=kind, name=name, manifest=manifest, drift=changed))
            else:
                actions.append(Action(verb="keep", kind=kind, name=name))
        else:
            actions.append(Action(verb="update", kind=kind, name=name, manifest=manifest))
    for (kind, name), current in seen.items():
        if (kind, name) in wanted or not owned_by(current, uid=owner_uid):
            continue
        actions.append(Action(verb="hold" if kind in hold else "delete", kind=kind, name=name))
    return actions
