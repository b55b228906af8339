"""Why engine pods do not start, from objects as a Kubernetes v1.36 control plane reported them (the
k8s lab: PodSecurity admission, the scheduler, hollow kubelets), and the status and Events built on it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleetgate.operator.builders import Owner
from fleetgate.operator.pod_problems import pod_problem
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status

FORBIDDEN = ('pods "rooted-67c74f8488-sjm4v" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != '
             'true (pod must not set securityContext.runAsNonRoot=false), runAsUser=0 (pod must not set runAsUser=0)')
DEPLOYMENT_REFUSED = {"spec": {"replicas": 1}, "metadata": {"generation": 1}, "status": {"observedGeneration": 1,
    "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                   {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": FORBIDDEN}]}}
NO_CLAIM = {"metadata": {"name": "llama-8b-lora-8465d88fb6-rpmtv"}, "status": {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": '0/3 nodes are available: persistentvolumeclaim "lora-adapters" not found. not found'}]}}
NO_SECRET = {"metadata": {"name": "llama-70b-659dfcf75b-x887l"}, "status": {"phase": "Pending", "containerStatuses": [
    {"name": "engine", "ready": False,
     "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}}]}}
STARTING = {"metadata": {"name": "ok-1"}, "status": {"phase": "Pending", "containerStatuses": [
    {"name": "engine", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}]}}  # fmt: skip
PENDING = {"spec": {"replicas": 2}, "metadata": {"generation": 1},
           "status": {"observedGeneration": 1, "replicas": 2, "unavailableReplicas": 2}}  # fmt: skip


def test_the_replica_sets_refusal_comes_first_with_the_api_servers_words() -> None:
    problem = pod_problem(deployment=DEPLOYMENT_REFUSED, pods=[NO_CLAIM])
    assert problem is not None and problem.reason == "FailedCreate" and problem.message == FORBIDDEN


def test_an_unschedulable_pod_names_the_missing_claim() -> None:
    problem = pod_problem(deployment=PENDING, pods=[NO_SECRET, NO_CLAIM])
    assert problem is not None and problem.reason == "FailedScheduling"
    assert problem.message.startswith("pod llama-8b-lora-8465d88fb6-rpmtv: 0/3 nodes are available")
    assert 'persistentvolumeclaim "lora-adapters" not found' in problem.message


def test_a_waiting_container_names_the_missing_secret_and_a_normal_start_is_no_problem() -> None:
    problem = pod_problem(deployment=PENDING, pods=[STARTING, NO_SECRET])
    assert problem is not None and problem.reason == "CreateContainerConfigError"
    assert problem.message == ('pod llama-70b-659dfcf75b-x887l, container engine: CreateContainerConfigError: '
                               'secret "hf-token" not found')  # fmt: skip
    assert pod_problem(deployment=PENDING, pods=[STARTING]) is None
    gone = {**NO_SECRET, "metadata": {**NO_SECRET["metadata"], "deletionTimestamp": "2026-11-27T13:59:00Z"}}
    assert pod_problem(deployment=PENDING, pods=[gone]) is None  # a pod on its way out is not the reason


def _status(problem_pods: list[dict[str, Any]], deployment: dict[str, Any], previous: dict[str, Any] | None = None,
            **extra: Any) -> dict[str, Any]:
    settings = OperatorSettings()
    spec = parse_spec({"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"},
                       "engine": {"quantization": "awq_marlin"},
                       "resources": {"accelerator": "nvidia-l4", "gpus": 1}, "replicas": 2})  # fmt: skip
    owner = Owner(name="qwen", namespace="ml", uid="u", generation=1)
    return compute_status(
        owner=owner, spec=spec, resolved=resolve(spec=spec, name="qwen", profiles=settings.profiles), invalid=None,
        deployment=deployment, previous=previous, now=dt.datetime(2026, 11, 27, tzinfo=dt.UTC),
        pod_problem=pod_problem(deployment=deployment, pods=problem_pods), **extra,
    )  # fmt: skip


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_status_is_degraded_with_the_reason_not_just_pending() -> None:
    status = _status([NO_CLAIM], PENDING)
    assert status["phase"] == "Degraded"
    degraded = _cond(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "FailedScheduling")
    assert "lora-adapters" in degraded["message"]
    assert _cond(status, "Progressing")["status"] == "True"  # still trying: pods stay pending, not failed


def test_after_the_progress_deadline_the_reason_is_still_the_pods() -> None:
    stuck = {**PENDING, "status": {**PENDING["status"], "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}  # fmt: skip
    degraded = _cond(_status([NO_SECRET], stuck), "Degraded")
    assert degraded["reason"] == "CreateContainerConfigError" and "hf-token" in degraded["message"]
    assert _cond(_status([], stuck), "Degraded")["reason"] == "ProgressDeadlineExceeded"


def test_the_hpa_failure_is_a_condition_naming_the_custom_metrics_api() -> None:
    message = ("the HPA was unable to compute the replica count: unable to get metric vllm_num_requests_waiting: "
               "unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) "
               "registered")  # fmt: skip
    hpa = {"status": {"conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
                                     {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
                                      "message": message}]}}  # fmt: skip
    active = _cond(_status([], PENDING, autoscaler=hpa), "AutoscalerActive")
    assert (active["status"], active["reason"], active["message"]) == ("False", "FailedGetPodsMetric", message)
    assert _cond(_status([], PENDING, autoscaler={}), "AutoscalerActive")["reason"] == "NoStatus"
    assert all(c["type"] != "AutoscalerActive" for c in _status([], PENDING)["conditions"])
