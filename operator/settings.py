"""Operator-level settings: what platform teams configure once for every InferenceService."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetgate.operator.profiles import Profiles

# The vLLM release the GPU tier proved (tests/gpu, docs/reports/gpu-h100.md); engine_image/Dockerfile.gpu pins it too.
DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.26.0"


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Optional APIs found in the cluster (checked at start-up)."""

    keda: bool = False
    service_monitor: bool = False


@dataclass(frozen=True, kw_only=True)
class OperatorSettings:
    engine_image: str = DEFAULT_ENGINE_IMAGE
    profiles: Profiles = field(default_factory=Profiles)
    field_manager: str = "fleetgate-operator"
    # Pods metrics as a metrics adapter (e.g. prometheus-adapter) exposes vLLM's `vllm:*` series to the HPA.
    hpa_queue_metric: str = "vllm_num_requests_waiting"
    hpa_kv_metric: str = "vllm_kv_cache_usage_perc"
    # Prometheus that KEDA's prometheus scaler queries.
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    shm_size: str = "16Gi"
    # Requests of an engine pod whose spec sets no cpu/memory: per GPU (or per CPU-profile replica).
    engine_cpu_request: int = 4
    engine_memory_request_gib: int = 16
    cluster_domain: str = "cluster.local"
    # UID (and GID, fsGroup) of engine pods: vLLM's images run as root unless told otherwise, and the
    # restricted Pod Security Standard refuses root. None: set none (a platform that assigns UIDs, OpenShift).
    engine_run_as_user: int | None = 1000
    # Startup probe budget: base + weights / load rate (download and load), capped.
    startup_base_s: int = 300
    startup_load_bytes_per_s: float = 100e6
    startup_max_s: int = 3 * 3600
    capabilities: Capabilities = field(default_factory=Capabilities)
    # A child the API server refused is applied again after this long (deleted children are recreated at
    # once, through their watch events).
    retry_failed_s: float = 60.0
    # A LoRA adapter that did not load is tried again after this long. Short, because Kopf holds back the
    # next spec change (e.g. the fix) until a pending retry is due.
    adapter_retry_s: float = 10.0
    # While engine pods are not all ready, they are looked at this often: the scheduler's verdict and a
    # container's waiting reason (a missing Secret, an image that cannot be pulled) come with no Deployment event.
    pod_check_s: float = 10.0
    # How often services with spec.scaleToZeroAfterSeconds are checked for idleness (operator/idle.py).
    idle_check_s: float = 30.0
    # Gateway API Inference Extension: the Endpoint Picker Service each published InferencePool names (in the
    # pool's namespace); None publishes no pools. Pools left by deleted services are swept every `pool_sweep_s`.
    epp_service: str | None = None
    epp_port: int = 9002
    epp_failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    pool_sweep_s: float = 300.0
