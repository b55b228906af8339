"""The operator against a real API server: envtest (KUBEBUILDER_ASSETS) or a cluster (KUBECONFIG).

envtest convention: `KUBEBUILDER_ASSETS` names a folder with `kube-apiserver` and `etcd`; the fixture starts
them on free loopback ports (static token auth, AlwaysAllow authorization), installs the generated CRD and
runs the operator in-process. What kmock cannot show is checked here: the API server enforces the CRD's
CEL rules, enums and defaults; server-side apply is the real one. There is no controller-manager in
envtest, so no pods and no garbage collection. Without the binaries or a cluster these tests are skipped,
and the skip says so: they have not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from fleetgate.operator.crd import build_crd
from fleetgate.operator.embedded import running_operator
from fleetgate.operator.handlers import register
from fleetgate.operator.kube import KubeApi, resource_class, status_code
from fleetgate.operator.settings import DEFAULT_ENGINE_IMAGE, OperatorSettings

ASSETS = os.environ.get("KUBEBUILDER_ASSETS", "")
HAVE_ENVTEST = bool(ASSETS) and all((Path(ASSETS) / b).is_file() for b in ("kube-apiserver", "etcd"))
pytestmark = [
    pytest.mark.kube,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not HAVE_ENVTEST,
        reason="not run: KUBEBUILDER_ASSETS does not point at kube-apiserver and etcd binaries (envtest)",
    ),
]
TOKEN = "fleetgate-envtest-token"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sa_keys(folder: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "sa.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (folder / "sa.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


@pytest.fixture(scope="module")
def apiserver() -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="fleetgate-envtest-"))
    etcd_port, peer_port, api_port = _port(), _port(), _port()
    _sa_keys(folder)
    (folder / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')
    etcd = subprocess.Popen(
        [f"{ASSETS}/etcd", "--data-dir", str(folder / "etcd"), "--unsafe-no-fsync",
         "--listen-client-urls", f"http://127.0.0.1:{etcd_port}", "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    api = subprocess.Popen(
        [f"{ASSETS}/kube-apiserver", "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
         f"--secure-port={api_port}", f"--etcd-servers=http://127.0.0.1:{etcd_port}", f"--cert-dir={folder}",
         "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=AlwaysAllow",
         f"--token-auth-file={folder / 'tokens.csv'}", f"--service-account-issuer=https://127.0.0.1:{api_port}",
         f"--service-account-key-file={folder / 'sa.pub'}", f"--service-account-signing-key-file={folder / 'sa.key'}",
         "--disable-admission-plugins=ServiceAccount"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"https://127.0.0.1:{api_port}"
    try:
        import httpx2

        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                response = httpx2.get(f"{url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}, verify=False)
                if response.status_code == 200:
                    break
            if time.monotonic() > deadline or api.poll() is not None:
                pytest.fail("kube-apiserver did not become ready within 60 s")
            time.sleep(0.5)
        yield url
    finally:
        for proc in (api, etcd):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def real_api(apiserver: str) -> AsyncIterator[KubeApi]:
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    api = KubeApi.from_server(url=apiserver, field_manager="test", token=TOKEN)
    crd = CustomResourceDefinition.from_dict(build_crd())
    with contextlib.suppress(Exception):
        await api._client.create(crd)
    deadline = time.monotonic() + 30
    while True:
        stored = await api._client.get(CustomResourceDefinition, "inferenceservices.fleetgate.io")
        conditions = stored.status.conditions if stored.status and stored.status.conditions else []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            break
        assert time.monotonic() < deadline, "CRD not established"
        await asyncio.sleep(0.2)
    try:
        yield api
    finally:
        await api.aclose()


@contextlib.asynccontextmanager
async def _running_operator(apiserver: str, settings: OperatorSettings | None = None, **peering: Any
                            ) -> AsyncIterator[None]:
    """The operator in a thread and event loop of its own (fleetgate.operator.embedded), cluster-wide;
    `peering` as for kopf.operator (standalone by default)."""
    registry = kopf.OperatorRegistry()
    register(
        registry=registry,
        settings=settings or OperatorSettings(),
        make_api=lambda: KubeApi.from_server(url=apiserver, field_manager="fleetgate-operator", token=TOKEN),
        login=lambda **_: kopf.ConnectionInfo(server=apiserver, token=TOKEN, insecure=True),
    )
    async with running_operator(
        registry=registry, clusterwide=True, ready_within=30, stop_within=15, **(peering or {"standalone": True})
    ):
        yield


@pytest.fixture
async def real_operator(apiserver: str, real_api: KubeApi) -> AsyncIterator[None]:
    async with _running_operator(apiserver):
        yield


def _cr(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fleetgate.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip


SMALL = {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq_marlin"}}


async def test_api_server_enforces_cel_rules_and_defaults(real_api: KubeApi) -> None:
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    bad = {**SMALL, "engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}}
    with pytest.raises(Exception) as info:
        await real_api._client.create(isvc.from_dict(_cr("cel-bad", bad)))
    assert status_code(info.value) == 422 and "tensorParallelSize" in str(info.value)
    stored = dict(await real_api._client.create(isvc.from_dict(_cr("defaults", SMALL))))
    assert stored["spec"]["engine"]["maxModelLen"] == 8192 and stored["spec"]["replicas"] == 1
    await real_api._client.delete(isvc, "defaults", namespace="default")


async def test_children_within_a_second_and_status(real_api: KubeApi, real_operator: None) -> None:
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    t0 = time.perf_counter()
    await real_api._client.create(isvc.from_dict(_cr("qwen", SMALL)))
    while await real_api.get_child(kind="Deployment", namespace="default", name="qwen") is None:
        assert time.perf_counter() - t0 < 10, "no Deployment within 10 s"
        await asyncio.sleep(0.02)
    latency = time.perf_counter() - t0
    assert await real_api.get_child(kind="Service", namespace="default", name="qwen") is not None
    while ((await real_api.get_inference_service(namespace="default", name="qwen")) or {}).get("status", {}).get(
        "phase"
    ) != "Pending":
        assert time.perf_counter() - t0 < 20, "status not written"
        await asyncio.sleep(0.05)
    print(f"envtest: CR applied -> Deployment exists in {latency * 1000:.0f} ms")
    assert latency < 5  # the 1 s p99 target is measured by `fleetgate bench operator`, not asserted on CI


async def test_api_server_refuses_names_children_cannot_use(real_api: KubeApi) -> None:
    """The CRD's CEL rule on metadata.name: a dot (not a Service name) or more than 63 characters."""
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    for name in ("qwen2.5-7b", "a" * 64):
        with pytest.raises(Exception) as info:
            await real_api._client.create(isvc.from_dict(_cr(name, SMALL)))
        assert status_code(info.value) == 422 and "DNS-1035" in str(info.value), name


async def test_api_server_refuses_idle_scale_down_with_an_autoscaler_or_under_a_minute(real_api: KubeApi) -> None:
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    for name, spec, words in (
        ("idle-hpa", {**SMALL, "scaleToZeroAfterSeconds": 600, "autoscaling": {"maxReplicas": 2}},
         "autoscaler owns replicas"),
        ("idle-short", {**SMALL, "scaleToZeroAfterSeconds": 30}, "scaleToZeroAfterSeconds"),
    ):
        with pytest.raises(Exception) as info:
            await real_api._client.create(isvc.from_dict(_cr(name, spec)))
        assert status_code(info.value) == 422 and words in str(info.value), name


async def test_api_server_refuses_gpus_that_are_not_a_multiple_of_tp(real_api: KubeApi) -> None:
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    bad = {**SMALL, "engine": {"tensorParallelSize": 2}, "resources": {"gpus": 3}}
    with pytest.raises(Exception) as info:
        await real_api._client.create(isvc.from_dict(_cr("gpus-3-tp-2", bad)))
    assert status_code(info.value) == 422 and "multiple of engine.tensorParallelSize" in str(info.value)


async def test_a_deleted_service_is_recreated_by_the_real_operator(real_api: KubeApi, real_operator: None) -> None:
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    await real_api._client.create(isvc.from_dict(_cr("heal", SMALL)))
    deadline = time.monotonic() + 20
    while (svc := await real_api.get_child(kind="Service", namespace="default", name="heal")) is None:
        assert time.monotonic() < deadline, "no Service within 20 s"
        await asyncio.sleep(0.05)
    await real_api.delete_child(kind="Service", namespace="default", name="heal")
    deadline = time.monotonic() + 20
    while True:
        again = await real_api.get_child(kind="Service", namespace="default", name="heal")
        if again is not None and again["metadata"]["uid"] != svc["metadata"]["uid"]:
            break
        assert time.monotonic() < deadline, "the deleted Service was not recreated within 20 s"
        await asyncio.sleep(0.05)
    await real_api._client.delete(isvc, "heal", namespace="default")


async def test_peered_operator_creates_its_peering_object_and_reconciles(apiserver: str, real_api: KubeApi) -> None:
    """`fleetgate operator` as the README runs it (peering on, no manual step): with the peering CRD
    installed but no ClusterKopfPeering object, it creates the object and reconciles."""
    from lightkube.generic_resource import create_global_resource
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    from fleetgate.operator.crd import build_peering_crds

    for crd in build_peering_crds():
        with contextlib.suppress(Exception):
            await real_api._client.create(CustomResourceDefinition.from_dict(crd))
    await asyncio.sleep(2)  # CRDs established
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    async with _running_operator(apiserver, standalone=False, peering_name="fleetgate"):
        await real_api._client.create(isvc.from_dict(_cr("peered", SMALL)))
        deadline = time.monotonic() + 30
        while ((await real_api.get_inference_service(namespace="default", name="peered")) or {}).get(
            "status", {}
        ).get("phase") is None:
            assert time.monotonic() < deadline, "a peered operator wrote no status within 30 s"
            await asyncio.sleep(0.1)
        peering = create_global_resource("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings")
        assert await real_api._client.get(peering, "fleetgate") is not None
        await real_api._client.delete(isvc, "peered", namespace="default")


async def _events_of(api: KubeApi, name: str, reason: str) -> list[str]:
    from lightkube.resources.core_v1 import Event

    return [
        str(e.message)
        async for e in api._client.list(Event, namespace="default", fields={"involvedObject.name": name})
        if e.reason == reason
    ]


async def _until(check: Any, *, within: float, what: str) -> float:
    """Poll the async `check` until it is true; returns the seconds it took."""
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < within, f"{what}: not within {within} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_edited_children_are_put_back_by_real_server_side_apply_within_5_s(
    real_api: KubeApi, real_operator: None
) -> None:
    """Defect: `kubectl scale`, `set image` and `patch svc` stayed until the next spec change (the spec hash
    matched). The Service edit is the JSON patch `kubectl patch --type=json` sends: the real API server then
    refuses the operator's apply (two ports named http, 422) and the merge-patch fallback puts it back."""
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Service
    from lightkube.types import PatchType

    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    await real_api._client.create(isvc.from_dict(_cr("drift", SMALL)))

    async def children() -> bool:
        return await real_api.get_child(kind="Service", namespace="default", name="drift") is not None and (
            await real_api.get_child(kind="Deployment", namespace="default", name="drift")) is not None

    await _until(children, within=20, what="children")
    client = real_api._client

    async def deployment() -> dict[str, Any]:
        return await real_api.get_child(kind="Deployment", namespace="default", name="drift") or {}

    async def service() -> dict[str, Any]:
        return await real_api.get_child(kind="Service", namespace="default", name="drift") or {}

    await client.patch(Deployment, "drift", {"spec": {"replicas": 3}}, namespace="default")  # kubectl scale
    took = [await _until(lambda: _replicas_are(deployment, 1), within=5, what="replicas put back")]
    image = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "evil/image:1"}]}}}}
    await client.patch(Deployment, "drift", image, namespace="default", patch_type=PatchType.STRATEGIC)  # set image
    took.append(await _until(lambda: _image_is(deployment, DEFAULT_ENGINE_IMAGE), within=5, what="image"))
    port = [{"op": "replace", "path": "/spec/ports/0/port", "value": 9000}]
    await client.patch(Service, "drift", port, namespace="default", patch_type=PatchType.JSON)  # patch svc
    took.append(await _until(lambda: _port_is(service, 8000), within=5, what="Service port put back"))
    print(f"envtest: scale, set image, patch svc put back in {', '.join(f'{t:.2f}' for t in took)} s")

    async def three_events() -> bool:
        return len(await _events_of(real_api, "drift", "DriftCorrected")) >= 3

    await _until(three_events, within=5, what="DriftCorrected Events")
    await asyncio.sleep(1)
    assert sorted(await _events_of(real_api, "drift", "DriftCorrected")) == [
        "Deployment drift: put back spec.replicas (was 3)",
        "Deployment drift: put back spec.template.spec.containers[engine].image (was 'evil/image:1')",
        "Service drift: put back spec.ports[http].port (was 9000)",
    ]
    assert [p["port"] for p in (await service())["spec"]["ports"]] == [8000]
    stored = await real_api.get_inference_service(namespace="default", name="drift") or {}
    assert all(c["reason"] != "ApplyFailed" for c in stored["status"]["conditions"])
    await client.delete(isvc, "drift", namespace="default")


async def _replicas_are(get: Any, n: int) -> bool:
    return bool((await get())["spec"].get("replicas") == n)


async def _image_is(get: Any, image: str) -> bool:
    return bool((await get())["spec"]["template"]["spec"]["containers"][0]["image"] == image)


async def _port_is(get: Any, port: int) -> bool:
    return bool([p["port"] for p in (await get())["spec"]["ports"]] == [port])


async def test_the_autoscalers_replicas_are_never_fought(real_api: KubeApi, real_operator: None) -> None:
    from lightkube.resources.apps_v1 import Deployment

    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    await real_api._client.create(isvc.from_dict(_cr("hpa", {**SMALL, "autoscaling": {"maxReplicas": 4}})))

    async def hpa() -> bool:
        return await real_api.get_child(kind="HorizontalPodAutoscaler", namespace="default", name="hpa") is not None

    await _until(hpa, within=20, what="HPA")
    await real_api._client.patch(Deployment, "hpa", {"spec": {"replicas": 4}}, namespace="default")  # as the HPA does
    await asyncio.sleep(2)
    dep = await real_api.get_child(kind="Deployment", namespace="default", name="hpa") or {}
    assert dep["spec"]["replicas"] == 4 and not await _events_of(real_api, "hpa", "DriftCorrected")
    await real_api._client.delete(isvc, "hpa", namespace="default")


async def test_engine_pods_pass_restricted_pod_security_admission(real_api: KubeApi) -> None:
    """The API server's PodSecurity admission judges the pod template the operator builds: admitted in a
    namespace that enforces `restricted`; a template that asks for root through spec.pod is refused."""
    from lightkube.resources.core_v1 import Namespace, Pod

    from fleetgate.operator.builders import Owner, build_children
    from fleetgate.operator.resolve import resolve
    from fleetgate.operator.spec import parse_spec

    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    with contextlib.suppress(Exception):
        await real_api._client.create(Namespace.from_dict({"metadata": {"name": "strict", "labels": labels}}))
    settings = OperatorSettings()

    def pod_of(spec: dict[str, Any], name: str) -> Any:
        parsed = parse_spec(spec)
        resolved = resolve(spec=parsed, name="qwen", profiles=settings.profiles)
        owner = Owner(name="qwen", namespace="strict", uid="u")
        dep = next(c for c in build_children(owner=owner, spec=parsed, resolved=resolved, settings=settings)
                   if c["kind"] == "Deployment")  # fmt: skip
        return Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "strict"},
                              "spec": dep["spec"]["template"]["spec"]})  # fmt: skip

    admitted = await real_api._client.create(pod_of(SMALL, "by-default"), dry_run=True)
    assert admitted.metadata is not None and admitted.metadata.name == "by-default"
    rooted = {**SMALL, "pod": {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}}
    with pytest.raises(Exception) as info:
        await real_api._client.create(pod_of(rooted, "as-root"), dry_run=True)
    assert status_code(info.value) == 403 and 'violates PodSecurity "restricted:latest"' in str(info.value)


async def test_refusals_name_the_field_not_nil(real_api: KubeApi) -> None:
    """Defect: a bad name was refused with the field path `<nil>`; an adapter named like metadata.name (no
    servedName: the served model's name) passed CEL."""
    isvc = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
    with pytest.raises(Exception) as info:
        await real_api._client.create(isvc.from_dict(_cr("qwen2.5-7b", SMALL)))
    assert "metadata.name: Invalid value" in str(info.value) and "<nil>" not in str(info.value)
    clash = {**SMALL, "adapters": [{"name": "clash", "source": "/adapters/sql"}]}
    with pytest.raises(Exception) as info:
        await real_api._client.create(isvc.from_dict(_cr("clash", clash)))
    assert status_code(info.value) == 422 and "spec.adapters: Invalid value" in str(info.value)
