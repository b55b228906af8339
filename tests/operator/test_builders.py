"""Builders: golden manifests for the example CRs, Kubernetes schema validity, and the behaviours that matter.

Golden files live in tests/operator/golden/. A change to a builder fails here until the goldens are
regenerated on purpose: `FLEETGATE_REGEN_GOLDEN=1 pytest tests/operator/test_builders.py`, then review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from fleetgate.engine.kube_names import ANNOTATION_SPEC_HASH
from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.builders.deployment import startup_failure_threshold
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import Capabilities, OperatorSettings
from fleetgate.operator.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
K8S_VERSION = "1.33.0"


def _children(doc: dict[str, Any], settings: OperatorSettings | None = None) -> list[dict[str, Any]]:
    settings = settings or OperatorSettings()
    meta = doc["metadata"]
    owner = Owner(name=meta["name"], namespace=meta.get("namespace", "default"), uid="00000000-uid", generation=1)
    spec = parse_spec(doc["spec"])
    resolved = resolve(spec=spec, name=owner.name, profiles=settings.profiles)
    return build_children(owner=owner, spec=spec, resolved=resolved, settings=settings)


def _example(stem: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / f"{stem}.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def _by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in children}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden_manifests(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    rendered = yaml.safe_dump_all(_children(doc), sort_keys=True)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("FLEETGATE_REGEN_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered)
    assert golden.exists(), f"{golden} missing: run with FLEETGATE_REGEN_GOLDEN=1 and review it"
    assert rendered == golden.read_text(), f"{path.stem}: builders changed; regenerate goldens on purpose"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_core_kinds_pass_kubernetes_schemas(path: Path) -> None:
    for manifest in _children(yaml.safe_load(path.read_text())):
        if manifest["apiVersion"] in ("v1", "apps/v1", "policy/v1", "autoscaling/v2"):
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_every_child_is_owned_labelled_and_hashed() -> None:
    for child in _children(
        _example("llama-70b-h100-tp4"), OperatorSettings(capabilities=Capabilities(service_monitor=True))
    ):
        meta = child["metadata"]
        (ref,) = meta["ownerReferences"]
        assert ref["kind"] == "InferenceService" and ref["controller"] is True and ref["uid"] == "00000000-uid"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "fleetgate"
        assert len(meta["annotations"][ANNOTATION_SPEC_HASH]) == 16


def test_deployment_runs_vllm_with_gpu_scheduling() -> None:
    dep = _by_kind(_children(_example("llama-70b-h100-tp4")))["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args = container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # Not QoS BestEffort: CPU and memory are requested even when the spec names none (per GPU by default).
    assert container["resources"]["requests"]["cpu"] == "16"
    assert container["resources"]["requests"]["memory"] == "64Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "replicas" not in dep["spec"]  # the autoscaler owns it


def test_fixed_replicas_without_autoscaler() -> None:
    kinds = _by_kind(_children(_example("speculative-llama-8b")))
    assert kinds["Deployment"]["spec"]["replicas"] == 2
    assert "HorizontalPodAutoscaler" not in kinds and "ScaledObject" not in kinds


def test_startup_probe_grows_with_model_size() -> None:
    settings = OperatorSettings()
    small = startup_failure_threshold(weight_bytes=4 * 10**9, settings=settings)
    large = startup_failure_threshold(weight_bytes=141 * 10**9, settings=settings)
    assert small == (300 + 40) // 10
    assert large == (300 + 1410) // 10
    assert startup_failure_threshold(weight_bytes=10**15, settings=settings) == settings.startup_max_s // 10


def test_hpa_or_keda_by_capability() -> None:
    doc = _example("llama-70b-h100-tp4")
    hpa = _by_kind(_children(doc))["HorizontalPodAutoscaler"]
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "vllm_num_requests_waiting"
    assert metric["target"] == {"type": "AverageValue", "averageValue": "8"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    doc["spec"]["autoscaling"].update({"minReplicas": 0, "scaleToZero": True})
    doc["spec"]["replicas"] = 0
    keda = _by_kind(_children(doc, OperatorSettings(capabilities=Capabilities(keda=True))))["ScaledObject"]
    assert keda["spec"]["minReplicaCount"] == 0
    assert 'model_name="llama-3.1-70b-instruct"' in keda["spec"]["triggers"][0]["metadata"]["query"]


def test_kubectl_scale_on_an_autoscaled_service_raises_the_autoscaler_floor() -> None:
    """`kubectl scale fgis --replicas N` sets spec.replicas: honoured as the floor, within maxReplicas."""
    doc = _example("llama-70b-h100-tp4")  # autoscaling 1..4
    for replicas, floor in ((1, 1), (3, 3), (9, 4)):
        doc["spec"]["replicas"] = replicas
        assert _by_kind(_children(doc))["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == floor
    keda_settings = OperatorSettings(capabilities=Capabilities(keda=True))
    doc["spec"]["autoscaling"].update({"minReplicas": 0, "scaleToZero": True})
    for replicas, floor in ((1, 0), (2, 2)):  # the default replicas: 1 keeps scale to zero
        doc["spec"]["replicas"] = replicas
        assert _by_kind(_children(doc, keda_settings))["ScaledObject"]["spec"]["minReplicaCount"] == floor


def test_kv_metric_target_in_milli_units() -> None:
    doc = _example("llama-70b-h100-tp4")
    doc["spec"]["autoscaling"].update({"metric": "kvCacheUsage", "targetKvCacheUsage": 0.75})
    hpa = _by_kind(_children(doc))["HorizontalPodAutoscaler"]
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "750m"


def test_service_monitor_only_with_its_crd() -> None:
    doc = _example("small-l4-awq")
    assert "ServiceMonitor" not in _by_kind(_children(doc))
    with_sm = _by_kind(_children(doc, OperatorSettings(capabilities=Capabilities(service_monitor=True))))
    assert with_sm["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "http"


def test_pvc_source_mounts_claim_read_only() -> None:
    doc = _example("small-l4-awq")
    doc["spec"]["model"]["source"] = "pvc://weights/qwen"
    pod = _by_kind(_children(doc))["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--model") + 1] == "/models/weights/qwen"


def test_spec_change_changes_only_affected_hashes() -> None:
    doc = _example("small-l4-awq")
    before = {c["kind"]: c["metadata"]["annotations"][ANNOTATION_SPEC_HASH] for c in _children(doc)}
    doc["spec"]["engine"]["maxNumSeqs"] = 16
    after = {c["kind"]: c["metadata"]["annotations"][ANNOTATION_SPEC_HASH] for c in _children(doc)}
    assert before["Deployment"] != after["Deployment"]
    assert before["Service"] == after["Service"] and before["PodDisruptionBudget"] == after["PodDisruptionBudget"]


def test_adapter_changes_leave_the_pod_template_and_its_hash_alone() -> None:
    """Adapters are loaded at runtime: adding, removing or re-ranking one must not roll the engine pods."""
    doc = _example("lora-llama-8b-adapters")
    before = _by_kind(_children(doc))["Deployment"]
    changed = {**doc, "spec": {**doc["spec"], "adapters": [
        {"name": "sql-assistant", "source": "hf://acme-data/llama-3.1-8b-sql-lora-v2", "rank": 8},
        {"name": "new-one", "source": "pvc://lora-adapters/new-one"},
    ]}}  # fmt: skip
    after = _by_kind(_children(changed))["Deployment"]
    assert after == before
    assert (
        before["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        == after["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    )
    container = before["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]
    assert "--enable-lora" in container["args"] and "--lora-modules" not in container["args"]
    # A claim no adapter used before is a new volume: that one change does roll the pods.
    other_claim = {**doc, "spec": {**doc["spec"], "adapters": [{"name": "x", "source": "pvc://elsewhere/x"}]}}
    assert _by_kind(_children(other_claim))["Deployment"] != before


def test_no_lora_no_runtime_env() -> None:
    container = _by_kind(_children(_example("small-l4-awq")))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != "VLLM_ALLOW_RUNTIME_LORA_UPDATING" for e in container["env"])


def test_kv_events_publish_on_named_pod_and_service_ports() -> None:
    doc = _example("speculative-llama-8b")
    doc["spec"]["engine"]["kvEvents"] = {"port": 5600, "replayPort": 5601, "topic": "kv@llama"}
    kinds = _by_kind(_children(doc))
    (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    config = json.loads(container["args"][container["args"].index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5600",
                      "replay_endpoint": "tcp://*:5601", "topic": "kv@llama", "buffer_steps": 10000}
    assert {"name": "kv-events", "containerPort": 5600, "protocol": "TCP"} in container["ports"]
    assert {"name": "kv-replay", "containerPort": 5601, "protocol": "TCP"} in container["ports"]
    service_ports = {p["name"]: p["port"] for p in kinds["Service"]["spec"]["ports"]}
    assert service_ports == {"http": 8000, "kv-events": 5600, "kv-replay": 5601}
    for manifest in kinds.values():
        if manifest["apiVersion"] in ("v1", "apps/v1"):
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    plain = _by_kind(_children(_example("speculative-llama-8b")))
    assert "--kv-events-config" not in plain["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [p["name"] for p in plain["Service"]["spec"]["ports"]] == ["http"]
