"""The reconcile plan and the status: pure functions, tested on their decisions."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.plan import POD_KINDS, plan
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status

OWNER = Owner(name="m", namespace="ns", uid="uid-1", generation=3)
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPEC = {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "replicas": 2}


def _desired(spec: dict[str, Any] = SPEC) -> list[dict[str, Any]]:
    parsed = parse_spec(spec)
    resolved = resolve(spec=parsed, name=OWNER.name, profiles=Profiles())
    return build_children(owner=OWNER, spec=parsed, resolved=resolved, settings=OperatorSettings())


def _verbs(actions: list[Any]) -> dict[str, str]:
    return {a.kind: a.verb for a in actions}


def test_fresh_service_creates_everything() -> None:
    actions = plan(desired=_desired(), observed=[], owner_uid=OWNER.uid)
    assert _verbs(actions) == {"Service": "create", "Deployment": "create", "PodDisruptionBudget": "create"}


def test_unchanged_children_are_kept_changed_ones_updated() -> None:
    observed = copy.deepcopy(_desired())
    assert all(a.verb == "keep" for a in plan(desired=_desired(), observed=observed, owner_uid=OWNER.uid))
    changed = _desired({**SPEC, "replicas": 3})
    assert _verbs(plan(desired=changed, observed=observed, owner_uid=OWNER.uid))["Deployment"] == "update"


def test_removed_autoscaler_is_deleted_but_foreign_objects_are_untouched() -> None:
    with_hpa = _desired({**SPEC, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}})
    foreign = {
        "kind": "ConfigMap",
        "metadata": {"name": "x", "ownerReferences": [{"uid": "other", "controller": True}]},
    }
    actions = plan(desired=_desired(), observed=[*with_hpa, foreign], owner_uid=OWNER.uid)
    verbs = _verbs(actions)
    assert verbs["HorizontalPodAutoscaler"] == "delete"
    assert "ConfigMap" not in verbs


def test_hold_creates_no_pods_and_deletes_nothing() -> None:
    observed = [c for c in _desired() if c["kind"] == "Deployment"]
    actions = plan(desired=_desired({**SPEC, "replicas": 5}), observed=observed, owner_uid=OWNER.uid, hold=POD_KINDS)
    verbs = _verbs(actions)
    assert verbs["Deployment"] == "hold" and verbs["PodDisruptionBudget"] == "hold"
    assert verbs["Service"] == "create"


def test_an_object_of_another_controller_is_a_conflict() -> None:
    theirs = copy.deepcopy([c for c in _desired() if c["kind"] == "Deployment"])
    theirs[0]["metadata"]["ownerReferences"] = [{"uid": "someone-else", "controller": True}]
    assert _verbs(plan(desired=_desired(), observed=theirs, owner_uid=OWNER.uid))["Deployment"] == "conflict"


def _status(spec: dict[str, Any] = SPEC, deployment: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    parsed = parse_spec(spec)
    resolved = resolve(spec=parsed, name=OWNER.name, profiles=Profiles())
    previous, now = kw.pop("previous", None), kw.pop("now", NOW)
    return compute_status(
        owner=OWNER, spec=parsed, resolved=resolved, invalid=None, deployment=deployment, previous=previous, now=now
    )


def _conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def _deployment(ready: int, updated: int | None = None, stuck: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}] if stuck else []
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 1,
            "readyReplicas": ready,
            "updatedReplicas": ready if updated is None else updated,
            "conditions": conditions,
        },
    }


def test_status_while_starting_and_when_ready() -> None:
    starting = _status(deployment=_deployment(0))
    assert starting["phase"] == "Pending" and starting["ready"] == "0/2"
    assert _conds(starting) == {
        "CapacityPlanned": ("True", "Fits"),
        "Ready": ("False", "NoReadyReplicas"),
        "Progressing": ("True", "Starting"),
        "Degraded": ("False", "AsExpected"),
    }
    assert starting["observedGeneration"] == 3
    assert starting["endpoint"] == "http://m.ns.svc.cluster.local:8000"
    assert starting["capacityPlan"]["fits"] is True
    assert "--max-model-len" in starting["engineArgs"]
    half = _status(deployment=_deployment(1))
    assert half["phase"] == "Progressing" and _conds(half)["Ready"] == ("True", "PartiallyReady")
    ready = _status(deployment=_deployment(2))
    assert ready["phase"] == "Ready"
    assert _conds(ready)["Ready"] == ("True", "AllReplicasReady")
    assert _conds(ready)["Progressing"] == ("False", "Complete")


def test_stuck_rollout_is_degraded() -> None:
    status = _status(deployment=_deployment(0, stuck=True))
    assert status["phase"] == "Degraded"
    assert _conds(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")


def test_does_not_fit_is_degraded_with_numbers() -> None:
    spec = {"model": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct"}, "resources": {"accelerator": "nvidia-l4"}}
    status = _status(spec=spec)
    assert status["phase"] == "DoesNotFit"
    assert _conds(status)["CapacityPlanned"] == ("False", "DoesNotFit")
    assert _conds(status)["Degraded"] == ("True", "DoesNotFit")
    message = next(c["message"] for c in status["conditions"] if c["type"] == "CapacityPlanned")
    assert "141.10 GB weights" in message


def test_invalid_spec_status() -> None:
    status = compute_status(
        owner=OWNER, spec=None, resolved=None, invalid="spec.engine: bad", deployment=None, previous=None, now=NOW
    )
    assert status["phase"] == "Invalid"
    assert _conds(status)["Degraded"] == ("True", "InvalidSpec")
    assert status["engineArgs"] is None and status["capacityPlan"] is None


def test_transition_time_moves_only_on_change() -> None:
    first = _status(deployment=_deployment(0))
    later = NOW + dt.timedelta(minutes=5)
    same = _status(deployment=_deployment(0), previous=first, now=later)
    flipped = _status(deployment=_deployment(2), previous=first, now=later)
    times = {c["type"]: c["lastTransitionTime"] for c in same["conditions"]}
    assert times["Ready"] == "2026-01-01T00:00:00Z"
    ready_time = next(c["lastTransitionTime"] for c in flipped["conditions"] if c["type"] == "Ready")
    assert ready_time == "2026-01-01T00:05:00Z"


def test_scaled_to_zero() -> None:
    status = _status(spec={**SPEC, "replicas": 0}, deployment={**_deployment(0), "spec": {"replicas": 0}})
    assert status["phase"] == "ScaledToZero"
    assert _conds(status)["Ready"] == ("False", "ScaledToZero")


def test_a_child_the_api_server_refused_is_degraded_and_not_ready() -> None:
    """Pods ready but the Service refused: no endpoints reach the gateway, so status must not say Ready."""
    parsed = parse_spec(SPEC)
    resolved = resolve(spec=parsed, name=OWNER.name, profiles=Profiles())
    status = compute_status(
        owner=OWNER, spec=parsed, resolved=resolved, invalid=None, deployment=_deployment(2), previous=None, now=NOW,
        failed=("Service/m: HTTP 422: Service \"m\" is invalid",),
    )  # fmt: skip
    assert status["phase"] == "Degraded"
    assert _conds(status)["Degraded"] == ("True", "ApplyFailed") and _conds(status)["Ready"] == ("False", "ApplyFailed")
    assert "Service/m" in next(c["message"] for c in status["conditions"] if c["type"] == "Degraded")


def test_70b_awq_on_two_l40s_fits_and_bf16_does_not_with_numbers() -> None:
    """Issue 15: weight bytes per GPU follow the quantization scheme. Llama 3.3 70B as 4-bit AWQ (~0.27 of
    bf16 with its 16-bit embeddings, lm_head and scales) fits 2 x L40S (48 GB) at TP 2; in bf16 it needs
    ~70 GB of weights per GPU and is DoesNotFit, saying how much."""
    base = {
        "resources": {"accelerator": "nvidia-l40s", "gpus": 2},
        "engine": {"tensorParallelSize": 2, "maxModelLen": 8192},
    }
    # The catalog's architecture facts for the model; the checkpoint's quantization sets bytes per weight.
    awq = _status(spec={**base, "model": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct"},
                        "engine": {**base["engine"], "quantization": "awq_marlin"}})
    assert awq["phase"] != "DoesNotFit", awq
    plan = awq["capacityPlan"]
    assert plan["fits"] is True
    assert 17e9 < plan["weightBytesPerGpu"] < 22e9, plan  # ~40 GB of AWQ weights over 2 GPUs
    assert plan["maxConcurrentSequences"] >= 8  # room for the KV cache of several 8K sequences
    bf16 = _status(spec={**base, "model": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct"}})
    assert bf16["phase"] == "DoesNotFit"
    message = next(c["message"] for c in bf16["conditions"] if c["type"] == "CapacityPlanned")
    assert "weights do not fit" in message and "70.55 GB weights" in message  # 141 GB / 2, with the numbers
