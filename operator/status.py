"""The InferenceService status, computed level-based from what is observed now. Pure.

Inputs: the CR's generation, the validated spec and its resolution (or the reason it is invalid), the
observed engine Deployment, conflicts found by the plan, and the previous status (only to keep each
condition's lastTransitionTime when its status did not change). Output: the whole status; keys set to
None are removed by the merge patch, so nothing stale survives.

Conditions (status True/False/Unknown, a CamelCase reason, a message with numbers):
- CapacityPlanned: True Fits | True ConcurrencyLimited | False DoesNotFit | Unknown NoPlan | Unknown InvalidSpec
- Ready: True when at least one engine pod is ready (AllReplicasReady / PartiallyReady), else False
- Progressing: True while pods start or roll out (Starting / RollingOut), else False
- Degraded: True for InvalidSpec, DoesNotFit, ApplyFailed (the API server refused a child; Ready is then
  False too: a model without its Service has no endpoints), Conflict, or engine pods the cluster refuses
  (`fleetgate.operator.pod_problems`: FailedCreate, FailedScheduling or the container's waiting reason, such
  as CreateContainerConfigError, with the cluster's message, which names the missing Secret or claim), else
  ProgressDeadlineExceeded
- AdaptersReady (LoRA on only): True Loaded when every ready pod holds every adapter of spec.adapters,
  False LoadFailed (the message names pod, adapter and reason), Unknown NoReadyPods. `status.adapters`
  lists, per ready pod, the adapters loaded and those failed with their reason.
- AutoscalerActive (with an HPA only): the HPA's own ScalingActive condition, reason and message
  (FailedGetPodsMetric names the missing custom metrics API), Unknown NoStatus before the HPA reports.
- ServedModelUnique: True Unique, or False SharedModelName naming the other InferenceServices of the
  namespace that serve the same model name (`fleetgate.operator.shared_names`); checked by reconcile
  passes, kept as it was by status refreshes.
Phase, for `kubectl get`: Invalid, DoesNotFit, Degraded, Pending, Progressing, Ready, ScaledToZero.
`endpoint` is the Service's URL, absent while a spec that does not fit has no engine (no Service is made).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetgate.engine.kube_names import ENGINE_PORT
from fleetgate.operator.adapters import PodAdapters, failures
from fleetgate.operator.builders.common import Owner, selector_labels
from fleetgate.operator.pod_problems import PodProblem
from fleetgate.operator.resolve import Resolved
from fleetgate.operator.spec import InferenceServiceSpec

CONDITION_TYPES = (
    "Ready", "Progressing", "Degraded", "CapacityPlanned", "AdaptersReady", "AutoscalerActive", "ServedModelUnique",
)
_MESSAGE_MAX = 1000


def _stamp(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    *,
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int,
    previous: dict[str, Any] | None,
) -> dict[str, Any]:
    before = next((c for c in (previous or {}).get("conditions") or [] if c.get("type") == type_), None)
    changed = before is None or before.get("status") != status
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": _stamp(now) if changed or before is None else before.get("lastTransitionTime"),
        "observedGeneration": generation,
    }


def _deployment_numbers(deployment: dict[str, Any] | None) -> tuple[int, int, int, bool, bool]:
    """(desired, ready, updated, rolled out to its latest generation, progress deadline exceeded)."""
    if deployment is None:
        return 0, 0, 0, False, False
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    current = int(status.get("observedGeneration") or 0) >= int(deployment.get("metadata", {}).get("generation") or 0)
    stuck = any(
        c.get("type") == "Progressing" and c.get("status") == "False" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in status.get("conditions") or []
    )
    return desired, ready, updated, current, stuck


def _adapters_condition(cond: Any, *, adapters: list[PodAdapters], wanted: int) -> dict[str, Any]:
    if not adapters:
        return cond("AdaptersReady", "Unknown", "NoReadyPods", "no ready engine pod to load adapters into")
    problems = failures(results=adapters)
    if problems:
        return cond("AdaptersReady", "False", "LoadFailed", "; ".join(problems)[:_MESSAGE_MAX])
    return cond("AdaptersReady", "True", "Loaded", f"{wanted} adapter(s) loaded on {len(adapters)} ready pod(s)")


def _autoscaler_condition(cond: Any, autoscaler: dict[str, Any]) -> dict[str, Any]:
    """The HPA's ScalingActive condition as ours (its reason and message say what it cannot read)."""
    for c in (autoscaler.get("status") or {}).get("conditions") or []:
        if c.get("type") == "ScalingActive" and c.get("status") in ("True", "False"):
            reason, message = str(c.get("reason") or "ScalingActive"), str(c.get("message") or "")
            return cond("AutoscalerActive", c["status"], reason, message)
    return cond("AutoscalerActive", "Unknown", "NoStatus", "the HorizontalPodAutoscaler has not reported yet")


def compute_status(
    *,
    owner: Owner,
    spec: InferenceServiceSpec | None,
    resolved: Resolved | None,
    invalid: str | None,
    deployment: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    now: dt.datetime,
    conflicts: tuple[str, ...] = (),
    cluster_domain: str = "cluster.local",
    failed: tuple[str, ...] = (),
    adapters: list[PodAdapters] | None = None,
    pod_problem: PodProblem | None = None,
    autoscaler: dict[str, Any] | None = None,
    shared_with: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """`adapters`: the last runtime adapter pass over the ready pods (None: LoRA off or no pass);
    `pod_problem`: why engine pods are not created, scheduled or started; `autoscaler`: the observed HPA;
    `shared_with`: other services serving the same model name (None: not checked, the previous verdict stays)."""
    gen = owner.generation

    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return condition(
            type_=type_, status=status, reason=reason, message=message, now=now, generation=gen, previous=previous
        )

    desired, ready, updated, current, stuck = _deployment_numbers(deployment)
    if spec is not None and spec.autoscaling is None and invalid is None:
        desired = spec.replicas
    plan = resolved.plan if resolved is not None else None
    fits = plan is None or plan.fits

    if invalid is not None or resolved is None:
        message = invalid or "spec could not be resolved"
        capacity = cond("CapacityPlanned", "Unknown", "InvalidSpec", message)
        degraded = cond("Degraded", "True", "InvalidSpec", message)
        progressing = cond("Progressing", "False", "InvalidSpec", "fix the spec; nothing is changed until then")
    else:
        if plan is None:
            capacity = cond("CapacityPlanned", "Unknown", "NoPlan", resolved.plan_note)
        elif not plan.fits:
            capacity = cond("CapacityPlanned", "False", "DoesNotFit", plan.reason)
        elif not plan.meets_target:
            capacity = cond("CapacityPlanned", "True", "ConcurrencyLimited", plan.reason)
        else:
            capacity = cond("CapacityPlanned", "True", "Fits", plan.reason)
        if not fits:
            degraded = cond("Degraded", "True", "DoesNotFit", f"no engine pods created: {resolved.plan_note}")
            progressing = cond("Progressing", "False", "DoesNotFit", "waiting for a spec that fits")
        elif failed:
            degraded = cond("Degraded", "True", "ApplyFailed", "; ".join(failed))
            progressing = cond("Progressing", "False", "ApplyFailed", "children could not be applied")
        elif conflicts:
            degraded = cond("Degraded", "True", "Conflict", f"owned by another controller: {', '.join(conflicts)}")
            progressing = cond("Progressing", "False", "Conflict", "children cannot be applied")
        elif stuck:
            reason, why = (
                (pod_problem.reason, pod_problem.message)
                if pod_problem is not None
                else ("ProgressDeadlineExceeded", "engine pods did not become ready in time")
            )
            degraded = cond("Degraded", "True", reason, why)
            progressing = cond("Progressing", "False", "ProgressDeadlineExceeded", f"{ready}/{desired} ready")
        else:
            degraded = (
                cond("Degraded", "True", pod_problem.reason, pod_problem.message)
                if pod_problem is not None
                else cond("Degraded", "False", "AsExpected", "")
            )
            busy = deployment is None or ready < desired or updated < desired or not current
            reason = "Starting" if ready == 0 else "RollingOut"
            progressing = (
                cond("Progressing", "True", reason, f"{ready}/{desired} engine pods ready, {updated} updated")
                if busy
                else cond("Progressing", "False", "Complete", f"{ready}/{desired} engine pods ready")
            )
    if failed and invalid is None:
        ready_cond = cond("Ready", "False", "ApplyFailed", f"{ready}/{desired} engine pods ready, children missing")
    elif ready > 0:
        why = "AllReplicasReady" if ready >= desired else "PartiallyReady"
        ready_cond = cond("Ready", "True", why, f"{ready}/{desired} engine pods ready")
    elif desired == 0 and fits and invalid is None:
        ready_cond = cond("Ready", "False", "ScaledToZero", "no replicas requested")
    else:
        ready_cond = cond("Ready", "False", "NoReadyReplicas", f"0/{desired} engine pods ready")

    if invalid is not None:
        phase = "Invalid"
    elif not fits:
        phase = "DoesNotFit"
    elif degraded["status"] == "True":
        phase = "Degraded"
    elif desired == 0:
        phase = "ScaledToZero"
    elif progressing["status"] == "True":
        phase = "Pending" if ready == 0 else "Progressing"
    else:
        phase = "Ready"

    served = resolved.served_model if resolved is not None else None
    unique = None
    if invalid is None and served is not None and shared_with is not None:
        unique = (
            cond("ServedModelUnique", "False", "SharedModelName",
                 f"model {served!r} is also served by {', '.join(shared_with)} in namespace {owner.namespace}: the "
                 "gateway spreads its requests over the pods of all of them")
            if shared_with
            else cond("ServedModelUnique", "True", "Unique", f"no other InferenceService here serves {served!r}")
        )  # fmt: skip
    elif invalid is None:
        kept = [c for c in (previous or {}).get("conditions") or [] if c.get("type") == "ServedModelUnique"]
        unique = kept[0] if kept else None
    lora = spec is not None and spec.lora_enabled and invalid is None
    adapters_cond = _adapters_condition(cond, adapters=adapters or [], wanted=len(spec.adapters) if spec else 0)
    return {
        "observedGeneration": gen,
        "phase": phase,
        "replicas": desired,
        "readyReplicas": ready,
        "ready": f"{ready}/{desired}",
        "selector": ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner).items())),
        "servedModel": served,
        "endpoint": (
            f"http://{owner.name}.{owner.namespace}.svc.{cluster_domain}:{ENGINE_PORT}"
            if resolved is not None and (fits or deployment is not None)
            else None
        ),
        "accelerator": resolved.profile.name if resolved is not None else None,
        "engineArgs": resolved.engine_args.to_argv() if resolved is not None else None,
        "capacityPlan": (
            {**plan.to_status(), "note": resolved.plan_note}
            if plan is not None and resolved is not None
            else ({"note": resolved.plan_note} if resolved is not None else None)
        ),
        "adapters": [r.to_status() for r in adapters] if adapters is not None and lora else None,
        "conditions": [
            capacity, ready_cond, progressing, degraded, *([adapters_cond] if lora else []),
            *([_autoscaler_condition(cond, autoscaler)] if autoscaler is not None and invalid is None else []),
            *([unique] if unique is not None else []),
        ],
    }
