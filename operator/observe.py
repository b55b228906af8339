"""What a status needs beyond the Deployment, and when to look again.

`observe` reads, only when they can matter: the engine pods (LoRA on, or replicas not all ready: the pods
hold the scheduler's verdict and the containers' waiting reasons, `fleetgate.operator.pod_problems`) and
the HPA (its ScalingActive condition; from the children a reconcile pass already listed, else one `get`).

`recheck_after` says when a service must be looked at again without waiting for an event
(`fleetgate.operator.resync`): a LoRA adapter that did not load, or no ready pod to load adapters into
while the Deployment reports ready ones, after `adapter_retry_s`; engine pods not all ready, after
`pod_check_s` (a pod's scheduling and container state change without a Deployment event). None: nothing
is pending, events will say when something changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgate.operator.adapters import PodAdapters, failures
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.kube import KubeApi
from fleetgate.operator.pod_problems import PodProblem, pod_problem
from fleetgate.operator.resolve import Resolved
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import InferenceServiceSpec


@dataclass(frozen=True, kw_only=True)
class Observed:
    pods: list[dict[str, Any]] = field(default_factory=list)
    autoscaler: dict[str, Any] | None = None  # our HPA, when the spec has autoscaling and no KEDA
    problem: PodProblem | None = None


def _replicas(deployment: dict[str, Any]) -> tuple[int, int]:
    """(desired, ready) of a Deployment as stored."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    return int(spec.get("replicas", 1) or 0), int(status.get("readyReplicas") or 0)


def fits(resolved: Resolved) -> bool:
    return resolved.plan is None or resolved.plan.fits


async def observe(
    *,
    api: KubeApi,
    owner: Owner,
    spec: InferenceServiceSpec,
    resolved: Resolved,
    settings: OperatorSettings,
    deployment: dict[str, Any] | None,
    children: Sequence[dict[str, Any]] | None = None,
) -> Observed:
    """Pods and HPA as far as they matter now (see the module docstring); `children`: already listed."""
    pods: list[dict[str, Any]] = []
    if deployment is not None and fits(resolved):
        desired, ready = _replicas(deployment)
        if spec.lora_enabled or ready < desired:
            pods = await api.list_engine_pods(namespace=owner.namespace, owner_name=owner.name)
    autoscaler = None
    if spec.autoscaling is not None and not settings.capabilities.keda:
        if children is not None:
            autoscaler = next((c for c in children if c.get("kind") == "HorizontalPodAutoscaler"), None)
        else:
            autoscaler = await api.get_child(kind="HorizontalPodAutoscaler", namespace=owner.namespace, name=owner.name)
    return Observed(pods=pods, autoscaler=autoscaler, problem=pod_problem(deployment=deployment, pods=pods))


def recheck_after(
    *,
    settings: OperatorSettings,
    spec: InferenceServiceSpec,
    resolved: Resolved,
    deployment: dict[str, Any] | None,
    adapters: list[PodAdapters] | None,
) -> float | None:
    if deployment is None or not fits(resolved):
        return None
    desired, ready = _replicas(deployment)
    waits: list[float] = []
    if spec.lora_enabled and (failures(results=adapters or []) or (ready > 0 and not adapters)):
        waits.append(settings.adapter_retry_s)
    if ready < desired:
        waits.append(settings.pod_check_s)
    return min(waits) if waits else None
