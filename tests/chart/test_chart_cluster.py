"""End to end on a real cluster: install the chart, run an InferenceService, uninstall cleanly.

Runs only when KUBECONFIG names a reachable cluster (kind, k3d, a dev cluster), otherwise it is
skipped with the reason. The cluster must be able to pull the control-plane image: set
FLEETGATE_E2E_IMAGE=repo:tag to a build of docker/fleetgate.Dockerfile that the nodes can reach
(e.g. `kind load docker-image`). Everything lives in a throwaway namespace that is deleted at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.core.helmbin import kubectl_path

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "fleetgate"
TIMEOUT_S = 300

pytestmark = pytest.mark.kube


def _run(
    cmd: list[str], *, timeout: float = 120, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _example_inference_service() -> dict[str, Any]:
    # The CPU example first: it runs on any cluster, no GPU needed.
    paths = sorted((REPO / "examples").glob("*.yaml"), key=lambda p: (not p.stem.startswith("cpu-"), p.name))
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceService":
                return doc
    pytest.fail("no InferenceService example under examples/")


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.skip("KUBECONFIG is not set: no cluster to install the chart into")
    kubectl = str(kubectl_path())
    probe = _run([kubectl, "version", "--request-timeout=10s", "-o", "json"], check=False, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"KUBECONFIG={kubeconfig} names no reachable cluster: {probe.stderr.strip()[:300]}")
    image = os.environ.get("FLEETGATE_E2E_IMAGE")
    if not image:
        pytest.skip("FLEETGATE_E2E_IMAGE is not set: the cluster needs a pullable build of docker/fleetgate.Dockerfile")
    namespace = f"fg-e2e-{uuid.uuid4().hex[:8]}"
    yield {"kubectl": kubectl, "namespace": namespace, "image": image}
    _run([kubectl, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false"], check=False)


def test_install_reconcile_uninstall(cluster: dict[str, str], helm: Path) -> None:
    kubectl, ns = cluster["kubectl"], cluster["namespace"]
    repo, _, tag = cluster["image"].rpartition(":")
    release = "fg-e2e"
    _run(
        [str(helm), "install", release, str(CHART_DIR), "--namespace", ns, "--create-namespace", "--wait",
         f"--timeout={TIMEOUT_S}s", f"--set=image.repository={repo}", f"--set=image.tag={tag}",
         "--set=gateway.config.server.auth=open", "--set=redis.persistence.enabled=false"],
        timeout=TIMEOUT_S + 30,
    )
    try:
        for component in ("operator", "gateway"):
            _run([kubectl, "-n", ns, "rollout", "status", f"deploy/{release}-fleetgate-{component}",
                  f"--timeout={TIMEOUT_S}s"], timeout=TIMEOUT_S + 30)

        service = _example_inference_service()
        service["metadata"]["namespace"] = ns
        _run([kubectl, "apply", "-f", "-"], stdin=json.dumps(service))
        name = service["metadata"]["name"]
        deadline = time.monotonic() + TIMEOUT_S
        owned: list[str] = []
        while time.monotonic() < deadline and not owned:
            out = _run([kubectl, "-n", ns, "get", "deployments", "-o", "json"]).stdout
            owned = [
                d["metadata"]["name"]
                for d in json.loads(out)["items"]
                if any(ref.get("kind") == "InferenceService" and ref.get("name") == name
                       for ref in d["metadata"].get("ownerReferences", []))
            ]
            if not owned:
                time.sleep(3)
        assert owned, f"the operator created no Deployment for InferenceService {name} within {TIMEOUT_S}s"
        _run([kubectl, "-n", ns, "delete", "inferenceservice", name, "--wait", f"--timeout={TIMEOUT_S}s"],
             timeout=TIMEOUT_S + 30)
    finally:
        _run([str(helm), "uninstall", release, "--namespace", ns, "--wait", f"--timeout={TIMEOUT_S}s"],
             timeout=TIMEOUT_S + 30)
    leftovers = _run([kubectl, "get", "clusterrole,clusterrolebinding", "-l",
                      f"app.kubernetes.io/instance={release}", "-o", "name"]).stdout.strip()
    assert not leftovers, f"cluster-scoped objects left after uninstall: {leftovers}"
    remaining = _run([kubectl, "-n", ns, "get", "deploy,sts,svc,cm,secret,sa,role,rolebinding", "-l",
                      f"app.kubernetes.io/instance={release}", "-o", "name"]).stdout.strip()
    assert not remaining, f"namespaced objects left after uninstall: {remaining}"


def test_install_after_a_cli_operator_and_again_after_uninstall(helm: Path) -> None:
    """Defects: the ClusterKopfPeering `fleetgate operator` creates has no Helm ownership metadata, so
    `helm install` refused to adopt it; and `helm uninstall` deleted the object other operators peer through.
    The chart renders no peering object now: install works with the CLI's object in place, uninstall keeps
    it, and a second install works too. No pod needs to run (no --wait), so any cluster will do."""
    import asyncio

    from fleetgate.operator.kube import KubeApi

    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.skip("KUBECONFIG is not set: no cluster to install the chart into")
    kubectl = str(kubectl_path())
    if _run([kubectl, "version", "--request-timeout=10s"], check=False, timeout=30).returncode != 0:
        pytest.skip(f"KUBECONFIG={kubeconfig} names no reachable cluster")
    suffix = uuid.uuid4().hex[:8]
    namespace, release, peering = f"fg-e2e-{suffix}", f"fg-{suffix}", f"fg-e2e-{suffix}"
    # The peering CRD, then the object exactly as `fleetgate operator --peering NAME` creates it.
    _run([kubectl, "apply", "--server-side", "-f", str(CHART_DIR / "crds" / "kopf-peering.yaml")])
    _run([kubectl, "wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s"])

    async def cli_creates() -> str:
        api = KubeApi.from_env(field_manager="fleetgate-operator")
        try:
            state, _peers = await api.ensure_cluster_peering(name=peering)
            return state
        finally:
            await api.aclose()

    assert asyncio.run(cli_creates()) == "created"
    install = [str(helm), "install", release, str(CHART_DIR), "--namespace", namespace, "--create-namespace",
               f"--set=operator.peering.name={peering}", "--set=gateway.config.server.auth=open",
               "--set=redis.persistence.enabled=false", "--skip-crds"]  # fmt: skip
    try:
        _run(install, timeout=180)
        _run([str(helm), "uninstall", release, "--namespace", namespace], timeout=180)
        kept = _run([kubectl, "get", "clusterkopfpeering", peering, "-o", "name"], check=False)
        assert kept.returncode == 0, f"helm uninstall deleted the ClusterKopfPeering: {kept.stderr}"
        _run(install, timeout=180)  # and again, with the object left by the first release's operator
    finally:
        _run([str(helm), "uninstall", release, "--namespace", namespace], check=False, timeout=180)
        _run([kubectl, "delete", "clusterkopfpeering", peering, "--ignore-not-found"], check=False)
        _run([kubectl, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false"], check=False)
