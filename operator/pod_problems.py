"""Why engine pods do not start, in the cluster's own words. Pure.

A Deployment whose pods never turn ready says only "0/1 ready" by itself. The reason is elsewhere:
- the ReplicaSet could not create the pods (Pod Security admission, a quota, a missing ServiceAccount):
  the Deployment controller copies it into the Deployment's `ReplicaFailure` condition, reason
  `FailedCreate`, with the API server's refusal as the message;
- the scheduler placed no pod (no node with the GPU or its taint tolerated, a PersistentVolumeClaim that
  does not exist): the pod's `PodScheduled` condition is False, reason `Unschedulable`; reported as
  `FailedScheduling` (the scheduler's Event reason) with its message ("0/3 nodes are available: ...",
  `persistentvolumeclaim "lora-adapters" not found`);
- the kubelet cannot start the container: its waiting reason (`CreateContainerConfigError` for a
  missing Secret, `ErrImagePull`, `ImagePullBackOff`, `CrashLoopBackOff`, ...) and message. The waiting
  reasons of a normal start (`ContainerCreating`, `PodInitializing`) are not problems.

`pod_problem` returns the first of these, in that order (pods by name, so the answer is stable across
passes): one condition and one Event say it, with the missing reference named as the cluster names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NORMAL_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
_MESSAGE_MAX = 600


@dataclass(frozen=True, kw_only=True)
class PodProblem:
    reason: str  # FailedCreate | FailedScheduling | the kubelet's waiting reason
    message: str


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)]


def _waiting(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(container, reason, message) of the first container waiting for an abnormal reason."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = ((container or {}).get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason and reason not in NORMAL_WAITING:
                return str(container.get("name", "")), str(reason), str(waiting.get("message") or "")
    return None


def pod_problem(*, deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> PodProblem | None:
    """The first reason engine pods are not created, scheduled or started (see the module docstring)."""
    for cond in _conditions(deployment or {}):
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            reason = str(cond.get("reason") or "FailedCreate")
            return PodProblem(reason=reason, message=str(cond.get("message") or "")[:_MESSAGE_MAX])
    live = sorted(
        (p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")),
        key=lambda p: str((p.get("metadata") or {}).get("name", "")),
    )
    for pod in live:
        for cond in _conditions(pod):
            verdict = (cond.get("type"), cond.get("status"), cond.get("reason"))
            if verdict == ("PodScheduled", "False", "Unschedulable"):
                name = (pod.get("metadata") or {}).get("name", "")
                message = f"pod {name}: {cond.get('message') or 'unschedulable'}"
                return PodProblem(reason="FailedScheduling", message=message[:_MESSAGE_MAX])
    for pod in live:
        found = _waiting(pod)
        if found is not None:
            container, reason, detail = found
            name = (pod.get("metadata") or {}).get("name", "")
            message = f"pod {name}, container {container}: {reason}" + (f": {detail}" if detail else "")
            return PodProblem(reason=reason, message=message[:_MESSAGE_MAX])
    return None
