"""The autoscaler: a KEDA ScaledObject when KEDA is installed, else an autoscaling/v2 HPA.

Signal: vLLM's own gauges per pod, `vllm:num_requests_waiting` (queue depth; the default) or
`vllm:kv_cache_usage_perc` (KV-cache use, 0..1). HPA: a Pods metric with an AverageValue target, read
through a metrics adapter that exposes the series under `OperatorSettings.hpa_*_metric`; HPA cannot go
below one replica, so scale to zero needs KEDA. KEDA: a Prometheus trigger on the same series summed over
the service's pods (KEDA divides by the replica count: AverageValue), `minReplicaCount` 0 when
`scaleToZero`. Both scale up fast (2 pods per minute, no stabilization) and down slowly (1 pod per 5 min
after 10 min stable): a GPU pod takes minutes to load its model, so flapping costs more than idling.
`spec.replicas` (what `kubectl scale fgis` sets through the scale subresource) is the autoscaler's floor
when it is above max(1, minReplicas), capped at maxReplicas: scaling an autoscaled service up is honoured
instead of silently ignored, and the default `replicas: 1` leaves minReplicas (and scale to zero) alone.
"""

from __future__ import annotations

from typing import Any

from fleetgate.operator.builders.common import Owner, child
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import Autoscaling, InferenceServiceSpec


def _behavior() -> dict[str, Any]:
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
        "scaleDown": {
            "stabilizationWindowSeconds": 600,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
        },
    }


def _quantity(value: float) -> str:
    """A Kubernetes quantity for a target: integers as is, fractions in milli-units (0.8 -> 800m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _target(auto: Autoscaling) -> float:
    return auto.target_queue_depth if auto.metric == "queueDepth" else auto.target_kv_cache_usage


def floor_replicas(*, auto: Autoscaling, replicas: int) -> int:
    """The fewest replicas the autoscaler may set: minReplicas, raised by `spec.replicas` (see the docstring)."""
    if replicas > max(1, auto.min_replicas):
        return min(replicas, auto.max_replicas)
    return auto.min_replicas


def build_hpa(*, owner: Owner, auto: Autoscaling, settings: OperatorSettings, replicas: int = 1) -> dict[str, Any]:
    metric = settings.hpa_queue_metric if auto.metric == "queueDepth" else settings.hpa_kv_metric
    return child(
        api_version="autoscaling/v2",
        kind="HorizontalPodAutoscaler",
        owner=owner,
        spec={
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
            "minReplicas": max(1, floor_replicas(auto=auto, replicas=replicas)),
            "maxReplicas": auto.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric},
                        "target": {"type": "AverageValue", "averageValue": _quantity(_target(auto))},
                    },
                }
            ],
            "behavior": _behavior(),
        },
    )


def build_scaled_object(
    *, owner: Owner, auto: Autoscaling, served_model: str, settings: OperatorSettings, replicas: int = 1
) -> dict[str, Any]:
    series = "vllm:num_requests_waiting" if auto.metric == "queueDepth" else "vllm:kv_cache_usage_perc"
    query = f'sum({series}{{namespace="{owner.namespace}",model_name="{served_model}"}})'
    return child(
        api_version="keda.sh/v1alpha1",
        kind="ScaledObject",
        owner=owner,
        spec={
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
            "minReplicaCount": _keda_min(auto=auto, replicas=replicas),
            "maxReplicaCount": auto.max_replicas,
            "cooldownPeriod": 600,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior()}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": settings.prometheus_url,
                        "query": query,
                        "threshold": str(_target(auto)),
                        "activationThreshold": "0",
                    },
                }
            ],
        },
    )


def _keda_min(*, auto: Autoscaling, replicas: int) -> int:
    floor = floor_replicas(auto=auto, replicas=replicas)
    if auto.scale_to_zero and floor == auto.min_replicas:
        return 0
    return max(1, floor)


def build_autoscaler(
    *, owner: Owner, spec: InferenceServiceSpec, settings: OperatorSettings, served_model: str | None = None
) -> dict[str, Any] | None:
    auto = spec.autoscaling
    if auto is None:
        return None
    if settings.capabilities.keda:
        return build_scaled_object(
            owner=owner,
            auto=auto,
            served_model=served_model or spec.model.served_name or owner.name,
            settings=settings,
            replicas=spec.replicas,
        )
    return build_hpa(owner=owner, auto=auto, settings=settings, replicas=spec.replicas)
