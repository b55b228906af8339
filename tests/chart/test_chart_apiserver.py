"""The rendered chart applied to an in-process Kubernetes API, then the real operator with its command line.

The API is kmock's emulator as the operator's tests use it (`fleetgate.operator.apisim`), extended with
every kind the chart renders. It is not a real API server: no RBAC enforcement, admission, defaulting or
controllers, so pods never run. What it proves: every manifest of `helm template --include-crds` maps to an
API resource and applies (`kubectl apply --server-side`, as Helm 4 installs) into the namespace it names;
the operator, started with exactly the arguments of the applied Deployment (scope, Kopf peering, priority;
cluster-wide, see the test), creates the peering object (the chart renders none), keeps its heartbeat there
and reconciles the CPU InferenceService from examples/ into an engine Deployment; the gateway's Kubernetes
discovery, built from the applied gateway.yaml, then routes the model to the engine's ready pod; every API
call the operator and the gateway made is granted by the Role/ClusterRole the chart binds to them (in the
namespace the call names); deleting the templates (what `helm uninstall` does) leaves nothing of the
release but the CRDs.

Why kubectl and not `helm install`: Helm keeps its release record in a Secret that client-go writes as
protobuf, which kmock cannot read, and Helm's in-memory driver swaps in a fake client that applies
nothing. The real `helm install`/`uninstall` run in test_chart_cluster.py when KUBECONFIG names a
cluster. Two emulator gaps are patched below: kmock reports Kubernetes 1.26 (the chart needs 1.28+)
and names the core group "/v1" in discovery.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
import yaml
from kmock._internal import apps
from prometheus_client import CollectorRegistry

from fleetgate.core.config import load_model
from fleetgate.core.helmbin import kubectl_path
from fleetgate.gateway.discovery.kubernetes import build_source
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.operator import run_cli
from fleetgate.operator.apisim import RESOURCES, VERBS, ApiServerEmulator
from fleetgate.operator.embedded import running_operator
from fleetgate.operator.handlers import register
from fleetgate.operator.kube import KubeApi, resource_class
from fleetgate.operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "fleetgate"
EXAMPLE = REPO / "examples" / "cpu-gemma-270m.yaml"
NAMESPACE = "fleet"
# Kinds the chart renders beyond what the operator's emulator declares: path -> (kind, namespaced).
CHART_RESOURCES = {
    "v1/serviceaccounts": ("ServiceAccount", True),
    "v1/configmaps": ("ConfigMap", True),
    "v1/secrets": ("Secret", True),
    "apps/v1/statefulsets": ("StatefulSet", True),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True),
    "rbac.authorization.k8s.io/v1/clusterroles": ("ClusterRole", False),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": ("ClusterRoleBinding", False),
    "kopf.dev/v1/kopfpeerings": ("KopfPeering", True),
    "kopf.dev/v1/clusterkopfpeerings": ("ClusterKopfPeering", False),
}


class ChartApiServer(ApiServerEmulator):
    """The operator's emulator, reporting a Kubernetes version the chart accepts."""

    async def _serve_server_version(self, request: Any) -> dict[str, str]:
        return {"major": "1", "minor": "35", "gitVersion": "v1.35.0", "gitCommit": "0" * 40,
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25",
                "compiler": "gc", "platform": "linux/amd64"}

    async def _serve_version(self, request: Any) -> Any:
        payload = await super()._serve_version(request)
        if isinstance(payload, dict) and str(payload.get("groupVersion", "")).startswith("/"):
            payload = {**payload, "groupVersion": payload["groupVersion"][1:]}  # core group: "v1"
        return payload


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[tuple[Any, str, Path]]:
    server = ChartApiServer()
    declared = {path: (kind, namespaced, subresources) for path, (kind, namespaced, subresources) in RESOURCES.items()}
    declared |= {path: (kind, namespaced, ()) for path, (kind, namespaced) in CHART_RESOURCES.items()}
    for path, (kind, namespaced, subresources) in declared.items():
        server.resources[path] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, subresources=subresources, verbs=set(VERBS)
        )
    async with server, apps.Server(server):
        url = str(server.url).rstrip("/")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "test", "user": {}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "test"}}],
        }))
        yield server, url, kubeconfig


TEST_TOKEN = "test-client"  # the test's own client, told apart from the operator's calls by its token
VERBS_BY_METHOD = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def _calls(requests: list[Any]) -> set[tuple[str | None, str, str, str]]:
    """(namespace, group, resource[/subresource], verb) of each API request, without the test's own."""
    out = set()
    for req in requests:
        headers = {k.lower(): v for k, v in req.headers.items()}
        if req.resource is None or req.resource.plural is None:  # discovery, /version
            continue
        if headers.get("user-agent", "").startswith("kubectl"):
            continue
        if headers.get("authorization") == f"Bearer {TEST_TOKEN}":
            continue
        if req.method == "GET":
            verb = "watch" if req.params.get("watch") in {"true", "1"} else ("get" if req.name else "list")
        else:
            verb = VERBS_BY_METHOD[req.method]
        resource = req.resource.plural + (f"/{req.subresource}" if req.subresource else "")
        out.add((req.namespace, req.resource.group, resource, verb))
    return out


def _granted(rendered: Any, component: str, namespace: str | None, group: str, resource: str, verb: str) -> bool:
    """Whether a Role (in `namespace`) or ClusterRole that the chart binds to `component` grants the call."""
    roles = rendered.component("ClusterRole", component)
    if namespace is not None:
        roles += [r for r in rendered.component("Role", component) if r["metadata"]["namespace"] == namespace]
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
               for role in roles for rule in role["rules"])


def _live(server: Any) -> dict[tuple[str, str | None, str], dict[str, Any]]:
    return {(res.plural, ns, name): obj.raw for (res, ns, name), obj in server.objects.items() if not obj.deleted}


async def _kubectl(kubeconfig: Path, *args: str, stdin: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(kubectl_path()), *args, "-f", "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={"HOME": str(kubeconfig.parent), "KUBECONFIG": str(kubeconfig)},
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout=120)
    assert proc.returncode == 0, f"kubectl {args[0]} failed:\n{err.decode()[-2000:]}"
    return out.decode()


async def test_apply_run_operator_and_delete(
    apiserver: tuple[Any, str, Path], chart: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url, kubeconfig = apiserver
    # Cluster-wide: kmock cannot list namespaces (GET /api/v1/namespaces fails), which Kopf does when it
    # serves a list of namespaces; the per-namespace RBAC and peering are covered by the render tests.
    # A fixed Redis password, so that the separate renders below agree (a generated one differs each time).
    mode = ["operator.watchAllNamespaces=true", "redis.auth.password=emulator-only"]
    # `helm test` Pods are not installed by `helm install` (and the emulator has no pods).
    with_crds = chart.template(extra=["--include-crds", "--skip-tests"], set_values=mode)
    templates_only = chart.template(extra=["--skip-tests"], set_values=mode)
    assert with_crds.returncode == 0 and templates_only.returncode == 0
    await _kubectl(kubeconfig, "apply", "--server-side", "--validate=false", stdin=with_crds.stdout)

    expected = chart.render(extra=["--include-crds", "--skip-tests"], set_values=mode)
    plural = {kind: path.rsplit("/", 1)[1] for path, (kind, _n, _s) in RESOURCES.items()}
    plural |= {kind: path.rsplit("/", 1)[1] for path, (kind, _n) in CHART_RESOURCES.items()}
    live = _live(server)
    for obj in expected.objects:
        key = (plural[obj["kind"]], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        assert key in live, f"helm did not create {obj['kind']} {key[1]}/{key[2]}"
        assert live[key].get("spec", live[key].get("rules")) == obj.get("spec", obj.get("rules")), key

    operator_deployment = live[("deployments", NAMESPACE, "fg-fleetgate-operator")]
    (container,) = operator_deployment["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    run_cli.add_arguments(parser)
    args = parser.parse_args(container["args"])

    # Phase 1: the real operator (Kopf + handlers + reconciler) with the applied Deployment's arguments.
    registry = kopf.OperatorRegistry()
    register(
        registry=registry,
        settings=OperatorSettings(),
        make_api=lambda: KubeApi.from_server(url=url, field_manager="fleetgate-operator"),
        login=lambda **_: kopf.ConnectionInfo(server=url, insecure=True),
    )
    operator_from = len(list(server))
    client = KubeApi.from_server(url=url, field_manager="test", token=TEST_TOKEN)
    example = yaml.safe_load(EXAMPLE.read_text())
    example["metadata"]["namespace"] = NAMESPACE
    name = example["metadata"]["name"]
    try:
        async with running_operator(
            registry=registry, clusterwide=not args.namespace, namespaces=args.namespace, standalone=args.standalone,
            peering_name=args.peering, priority=args.priority, memo=kopf.Memo(), ready_within=30, stop_within=10,
        ) as operator:
            cls = resource_class("fleetgate.io", "v1alpha1", "InferenceService", "inferenceservices")
            await client._client.create(cls.from_dict(example))
            deadline = time.monotonic() + 30
            engines: list[str] = []
            while not engines and time.monotonic() < deadline:
                engines = [
                    n for (res, ns, n), obj in _live(server).items()
                    if res == "deployments" and ns == NAMESPACE
                    and any(r.get("kind") == "InferenceService" and r.get("name") == name
                            for r in obj["metadata"].get("ownerReferences", []))
                ]
                await asyncio.sleep(0.1)
            assert engines, f"the operator made no engine Deployment for {name} within 30 s"
            assert not operator.done(), "the operator stopped"
            peering = _live(server)[("clusterkopfpeerings", None, args.peering)]
            assert peering.get("status"), "the operator never wrote its heartbeat into the peering object it created"
    finally:
        await client.aclose()
    operator_calls = _calls(list(server)[operator_from:])

    # Phase 2: the gateway's discovery, built by the real wiring from the applied gateway.yaml, finds the
    # engine once a ready pod is listed in an EndpointSlice (the emulator has no EndpointSlice controller,
    # so the test plays it: labels copied from the operator's Service, as Kubernetes does).
    service = _live(server)[("services", NAMESPACE, name)]
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{name}-abcde", "namespace": NAMESPACE, "labels": {
            **service["metadata"].get("labels", {}), "kubernetes.io/service-name": name}},
        "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True},
                       "targetRef": {"kind": "Pod", "name": f"{name}-0", "namespace": NAMESPACE}}],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }
    await _kubectl(kubeconfig, "apply", "--server-side", "--validate=false", stdin=json.dumps(endpoint_slice))
    config = tmp_path / "gateway.yaml"
    # gateway.yaml is a Secret here: it carries the bundled Redis's password.
    config.write_text(_live(server)[("secrets", NAMESPACE, "fg-fleetgate-gateway")]["stringData"]["gateway.yaml"])
    settings = load_model(GatewaySettings, config)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    gateway_from = len(list(server))
    source = build_source(settings, registry=CollectorRegistry())
    await source.start()
    try:
        served = example["spec"]["model"]["servedName"]
        assert source.models() == [served]
        assert [e.url for e in source.endpoints(served)] == ["http://10.0.0.7:8000"]
    finally:
        await source.aclose()
    gateway_calls = _calls(list(server)[gateway_from:])

    # Phase 3: every call each component made is granted by the RBAC the chart bound to its account.
    for component, calls in (("operator", operator_calls), ("gateway", gateway_calls)):
        assert calls, f"no {component} calls recorded"
        denied = sorted(c for c in calls if not _granted(expected, component, *c))
        assert not denied, f"RBAC denies these {component} calls (namespace, group, resource, verb): {denied}"

    await _kubectl(kubeconfig, "delete", "--wait=false", stdin=templates_only.stdout)
    left = {key for key, obj in _live(server).items()
            if obj["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == "fg"}
    assert not left, f"objects of the release left after deleting its templates: {sorted(left)}"
    crds = {name for (res, _ns, name) in _live(server) if res == "customresourcedefinitions"}
    assert "inferenceservices.fleetgate.io" in crds, "the CRD (and so every InferenceService) must survive"


async def test_upgrade_without_the_key_hashes_is_refused_while_auth_is_api_key(
    apiserver: tuple[Any, str, Path], helm: Path, helm_home: Path
) -> None:
    """`helm upgrade -f my-values.yaml` without the hashes would delete the release's keys Secret and leave
    the gateway on auth: api_key (every client 401): the chart fails instead. `--dry-run=server` renders
    with `lookup` against the emulator, as an upgrade does."""
    from lightkube.resources.core_v1 import Secret

    from .conftest import Chart

    _server, url, kubeconfig = apiserver
    chart = Chart(helm=helm, home=helm_home, env={"KUBECONFIG": str(kubeconfig)})
    hashes = ['gateway.apiKeys.adminKeyHashes=["sha256:' + "0" * 64 + '"]']
    server_side = ["--dry-run=server", "--disable-openapi-validation"]  # kmock serves no OpenAPI document
    first = await asyncio.to_thread(chart.template, set_json=hashes, extra=server_side, namespace=NAMESPACE)
    assert first.returncode == 0, first.stderr  # a first install: no Secret yet, nothing to protect
    assert (await asyncio.to_thread(chart.template, extra=server_side, namespace=NAMESPACE)).returncode == 0

    client = KubeApi.from_server(url=url, field_manager="test", token=TEST_TOKEN)
    try:
        await client._client.create(Secret.from_dict({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "fg-fleetgate-gateway-keys", "namespace": NAMESPACE,  # as the release made it
                         "labels": {"app.kubernetes.io/managed-by": "Helm"},
                         "annotations": {"meta.helm.sh/release-name": "fg",
                                         "meta.helm.sh/release-namespace": NAMESPACE}},
            "stringData": {"keys.yaml": "admin_key_hashes: []\n"},
        }))  # fmt: skip
    finally:
        await client.aclose()
    refused = await asyncio.to_thread(chart.template, extra=server_side, namespace=NAMESPACE)
    assert refused.returncode != 0 and "every client would get 401" in refused.stderr, refused.stderr
    assert "fleet/fg-fleetgate-gateway-keys" in refused.stderr
    kept = await asyncio.to_thread(chart.template, set_json=hashes, extra=server_side, namespace=NAMESPACE)
    assert kept.returncode == 0, kept.stderr
    opened = await asyncio.to_thread(
        chart.template, set_values=["gateway.config.server.auth=open"], extra=server_side, namespace=NAMESPACE
    )
    assert opened.returncode == 0, opened.stderr
