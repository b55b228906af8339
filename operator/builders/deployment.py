"""The engine Deployment: vLLM's OpenAI server with flags from `EngineArgs`, sized probes, GPU scheduling.

- Command: `python3 -m vllm.entrypoints.openai.api_server` + `EngineArgs.to_argv()`, the one place flags
  are decided (no shell, so no quoting surprises).
- Startup probe on `/health`, sized for model loading: budget = base + weight bytes / load rate (download
  and load into GPU memory), capped (`OperatorSettings.startup_*`); period 10 s, so
  failureThreshold = ceil(budget / 10). Readiness on `/health` every 5 s; liveness on `/health` after start.
- `/dev/shm` is a memory-backed emptyDir (NCCL and PyTorch workers need more than the 64 MiB default).
- The model cache is an emptyDir capped at `spec.model.cacheSize` (`HF_HOME` points there); `pvc://` sources
  (the model's and the LoRA adapters') mount their claim read-only under /models.
- LoRA: the engine args' env (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), so the operator can load and
  unload adapters at runtime. The adapters themselves are not in the pod template (no `--lora-modules`):
  adding or removing one leaves the template, its hash and the pods as they are. Only a new adapter
  claim (pvc://) or turning LoRA on or off (`--enable-lora`, its slots) rolls the pods.
- CPU profiles: `VLLM_CPU_KVCACHE_SPACE` = the profile's `kv_cache_space_gib`, the KV budget of the plan.
- GPUs: the profile's extended resource (limits = requests = `spec.resources.gpus`), node selector and
  tolerations; CPU and memory requests default per GPU (`OperatorSettings.engine_*_request`), never
  none. Prometheus scrape annotations on the pod template (vLLM serves `/metrics` on the API port).
- KV-cache events (`engine.kvEvents`): `--kv-events-config` binds `tcp://*:<port>` and `tcp://*:<replayPort>`,
  declared as the named container ports `kv-events` and `kv-replay` (the Service lists them too, so the
  gateway's discovery finds each pod's event address in its EndpointSlices).
- Rollout: maxSurge 1, maxUnavailable 0: capacity never drops during a rollout; a new pod that cannot be
  scheduled leaves the old one serving.
- `replicas` is omitted when an autoscaler owns it, so server-side apply never fights the HPA.
- Security: the `restricted` Pod Security Standard by default, `spec.pod` over it
  (`fleetgate.operator.builders.pod_security`: a non-root UID, HOME in the model cache, seccomp, no
  privilege escalation, no capabilities).
"""

from __future__ import annotations

import math
from typing import Any

from fleetgate.engine.args import VLLM_MODULE
from fleetgate.engine.kube_names import (
    ANNOTATION_SERVED_MODEL,
    ENGINE_PORT,
    ENGINE_PORT_NAME,
    KV_EVENTS_PORT_NAME,
    KV_REPLAY_PORT_NAME,
)
from fleetgate.engine.pod_paths import MODELS_MOUNT
from fleetgate.operator.builders.common import Owner, child, labels, selector_labels
from fleetgate.operator.builders.pod_security import apply_pod_settings, home_env
from fleetgate.operator.resolve import Resolved
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import InferenceServiceSpec

CACHE_MOUNT = "/model-cache"
PROBE_PERIOD_S = 10


def startup_failure_threshold(*, weight_bytes: int | None, settings: OperatorSettings) -> int:
    budget = settings.startup_base_s
    if weight_bytes is not None:
        budget += math.ceil(weight_bytes / settings.startup_load_bytes_per_s)
    return math.ceil(min(budget, settings.startup_max_s) / PROBE_PERIOD_S)


def _probe(*, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": ENGINE_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _resources(*, spec: InferenceServiceSpec, resolved: Resolved, settings: OperatorSettings) -> dict[str, Any]:
    """GPUs as limits = requests; CPU and memory as the spec says, else default requests (per GPU, or one
    CPU replica's), so an engine pod is never QoS BestEffort: the first evicted under node pressure."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    units = max(1, spec.resources.gpus) if resolved.profile.is_gpu else 1
    requests["cpu"] = spec.resources.cpu or str(settings.engine_cpu_request * units)
    if spec.resources.memory:
        requests["memory"] = limits["memory"] = spec.resources.memory
    else:
        requests["memory"] = f"{settings.engine_memory_request_gib * units}Gi"
    if resolved.profile.is_gpu and spec.resources.gpus:
        requests[resolved.profile.resource_name] = limits[resolved.profile.resource_name] = str(spec.resources.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _volumes(*, spec: InferenceServiceSpec, resolved: Resolved, settings: OperatorSettings) -> tuple[list, list]:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
        {"name": "model-cache", "emptyDir": {"sizeLimit": spec.model.cache_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": CACHE_MOUNT},
    ]
    claim = resolved.location.pvc_claim
    if claim is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": f"{MODELS_MOUNT}/{claim}", "readOnly": True})
    for index, other in enumerate(c for c in resolved.volume_claims() if c != claim):
        name = f"adapters-{index}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": other, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{MODELS_MOUNT}/{other}", "readOnly": True})
    return volumes, mounts


def engine_ports(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The HTTP port, and with `engine.kvEvents` the KV-event publisher and replay ports, all named."""
    ports = [{"name": ENGINE_PORT_NAME, "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    kv = spec.engine.kv_events
    if kv is not None:
        ports += [{"name": KV_EVENTS_PORT_NAME, "containerPort": kv.port, "protocol": "TCP"},
                  {"name": KV_REPLAY_PORT_NAME, "containerPort": kv.replay_port, "protocol": "TCP"}]
    return ports


def build_deployment(
    *, owner: Owner, spec: InferenceServiceSpec, resolved: Resolved, settings: OperatorSettings
) -> dict[str, Any]:
    volumes, mounts = _volumes(spec=spec, resolved=resolved, settings=settings)
    env = [
        {"name": "HF_HOME", "value": CACHE_MOUNT},
        *home_env(cache_mount=CACHE_MOUNT),
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
    if not resolved.profile.is_gpu and resolved.profile.kv_cache_space_gib:
        # The KV budget the capacity plan assumed: vLLM CPU reads it from this variable.
        env.append({"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(resolved.profile.kv_cache_space_gib)})
    env += [{"name": key, "value": value} for key, value in sorted(resolved.engine_args.env().items())]
    weight_bytes = resolved.plan.weight_bytes if resolved.plan is not None else None
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image or settings.engine_image,
        "command": ["python3", "-m", VLLM_MODULE],
        "args": resolved.engine_args.to_argv(),
        "ports": engine_ports(spec),
        "env": env,
        **(
            {"envFrom": [{"secretRef": {"name": spec.model.credentials_secret}}]}
            if spec.model.credentials_secret
            else {}
        ),
        "resources": _resources(spec=spec, resolved=resolved, settings=settings),
        "volumeMounts": mounts,
        "startupProbe": _probe(
            period=PROBE_PERIOD_S, failures=startup_failure_threshold(weight_bytes=weight_bytes, settings=settings)
        ),
        "readinessProbe": _probe(period=5, failures=3),
        "livenessProbe": _probe(period=10, failures=6),
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 60,
        "enableServiceLinks": False,
    }
    if resolved.profile.node_selector:
        pod_spec["nodeSelector"] = dict(resolved.profile.node_selector)
    if resolved.profile.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in resolved.profile.tolerations]
    template_meta: dict[str, Any] = {
        "labels": labels(owner),
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(ENGINE_PORT),
            "prometheus.io/path": "/metrics",
            ANNOTATION_SERVED_MODEL: resolved.served_model,
        },
    }
    apply_pod_settings(pod_spec=pod_spec, template_meta=template_meta, pod=spec.pod, settings=settings)
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(owner)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "progressDeadlineSeconds": max(600, PROBE_PERIOD_S * container["startupProbe"]["failureThreshold"] + 120),
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if spec.autoscaling is None:
        deployment_spec = {"replicas": spec.replicas, **deployment_spec}
    body = child(api_version="apps/v1", kind="Deployment", owner=owner, spec=deployment_spec)
    body["metadata"]["annotations"][ANNOTATION_SERVED_MODEL] = resolved.served_model
    return body
