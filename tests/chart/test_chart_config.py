"""The configuration the chart renders is accepted by the real loaders, and the pods find it.

For every scenario: the gateway's gateway.yaml (from its ConfigMap) goes through
`load_model(GatewaySettings, path)`, its tenancy section through `TenancyConfig`, and the hashed key
file the chart puts into a Secret through `load_keys_file` + `merged_with_keys_file`, exactly as the
gateway does at start-up. The paths in the config and the command line match the volume mounts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
import redis.exceptions
import yaml

from fleetgate.core.config import load_model, parse_model
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.config import TenancyConfig, load_keys_file, merged_with_keys_file


def _gateway(rendered: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway Deployment and the object holding gateway.yaml (a ConfigMap, or a Secret when the config
    carries a Redis password), reduced to {"metadata", "kind", "data": {file: text}}."""
    (deployment,) = rendered.component("Deployment", "gateway")
    holders = [o for o in rendered.component("ConfigMap", "gateway") + rendered.component("Secret", "gateway")
               if "gateway.yaml" in (o.get("data") or o.get("stringData") or {})]
    (holder,) = holders
    return deployment, {"kind": holder["kind"], "metadata": holder["metadata"],
                        "data": holder.get("data") or holder["stringData"]}


def _mounted_file(deployment: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volume and the file name inside it that a container path resolves to."""
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    target = PurePosixPath(path)
    mounts = sorted(container["volumeMounts"], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        if target.is_relative_to(mount["mountPath"]):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            return volume, str(target.relative_to(mount["mountPath"]))
    raise AssertionError(f"{path} is on no volume mount")


def _load_settings(configmap: dict[str, Any], tmp_path: Path) -> GatewaySettings:
    (key,) = configmap["data"]
    path = tmp_path / key
    path.write_text(configmap["data"][key])
    return load_model(GatewaySettings, path)


def test_gateway_config_loads_with_the_real_settings(chart: Any, scenario: Path, tmp_path: Path) -> None:
    rendered = chart.render(values=[scenario])
    if not rendered.component("Deployment", "gateway"):
        pytest.skip(f"{scenario.name} runs no gateway")
    deployment, configmap = _gateway(rendered)
    settings = _load_settings(configmap, tmp_path)

    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config_arg = next(a for a in container["args"] if a.startswith("--config="))
    volume, filename = _mounted_file(deployment, config_arg.removeprefix("--config="))
    source = volume.get("configMap", {}).get("name") or volume["secret"]["secretName"]
    assert ("secret" in volume) == (configmap["kind"] == "Secret")
    assert source == configmap["metadata"]["name"]
    assert filename in configmap["data"]

    assert settings.server.host == "0.0.0.0"
    assert settings.server.port == container["ports"][0]["containerPort"]
    # SIGTERM comes after the preStop sleep; the drain, the flush of ended streams and the settle writes
    # must all end before the kubelet's SIGKILL at the grace period (issue 26).
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert pre_stop + settings.server.drain_s + settings.server.drain_close_s + settings.server.settle_s + 1 <= grace
    assert settings.discovery.kind == "kubernetes"
    discovery_roles = rendered.component("Role", "gateway")
    assert [r["metadata"]["namespace"] for r in discovery_roles] == [settings.discovery.namespace]

    replicas = deployment["spec"].get("replicas")
    hpa = rendered.component("HorizontalPodAutoscaler", "gateway")
    most = hpa[0]["spec"]["maxReplicas"] if hpa else replicas
    if most > 1:
        assert settings.redis_url, "several gateway replicas without shared state"
    redis_services = rendered.component("Service", "redis")
    if redis_services:
        service = next(s for s in redis_services if s["spec"].get("clusterIP") != "None")
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        url = urlsplit(settings.redis_url)
        port = service["spec"]["ports"][0]["port"]
        assert (url.scheme, url.hostname, url.port) == ("redis", f"{name}.{namespace}.svc", port)
        secrets = rendered.component("Secret", "redis")
        if secrets:
            password = base64.b64decode(secrets[0]["data"]["redis-password"]).decode()
            assert unquote(url.password or "") == password and len(password) >= 32
            assert configmap["kind"] == "Secret", "a password must not sit in a ConfigMap"
        else:
            assert url.password is None

    tenancy = parse_model(TenancyConfig, settings.tenancy, source="tenancy section")
    if tenancy.keys_file is None:
        return
    volume, filename = _mounted_file(deployment, str(tenancy.keys_file))
    secret_name = volume["secret"]["secretName"]
    (item,) = volume["secret"]["items"]
    assert item["path"] == filename
    external = (yaml.safe_load(scenario.read_text()) or {}).get("gateway", {}).get("apiKeys", {})
    if secret_name == external.get("existingSecret"):
        assert item["key"] == external.get("secretKey", "keys.yaml")
        return
    secret = rendered.get("Secret", secret_name)
    keys_path = tmp_path / "keys.yaml"
    keys_path.write_text(secret["stringData"][item["key"]])
    keys = load_keys_file(keys_path)
    merged = merged_with_keys_file(tenancy, keys, source=str(keys_path))
    hashes = {h for t in merged.tenants for h in t.key_hashes} | set(merged.admin_key_hashes)
    assert hashes, "the chart created a key Secret with no keys"


def test_api_key_hashes_reach_their_tenants(chart: Any, tmp_path: Path) -> None:
    admin, team = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    rendered = chart.render(
        set_json=['gateway.config.tenancy={"tenants": [{"id": "team-a", "rpm": 60}]}'],
        set_values=[f"gateway.apiKeys.adminKeyHashes={{{admin}}}", f"gateway.apiKeys.tenants.team-a={{{team}}}"],
    )
    deployment, configmap = _gateway(rendered)
    tenancy = parse_model(TenancyConfig, _load_settings(configmap, tmp_path).tenancy)
    volume, _ = _mounted_file(deployment, str(tenancy.keys_file))
    secret = rendered.get("Secret", volume["secret"]["secretName"])
    path = tmp_path / "keys.yaml"
    path.write_text(secret["stringData"]["keys.yaml"])
    merged = merged_with_keys_file(tenancy, load_keys_file(path))
    assert merged.admin_key_hashes == [admin]
    tenant = merged.tenant("team-a")
    assert tenant is not None and tenant.key_hashes == [team]


def test_config_changes_roll_the_gateway_pods(chart: Any) -> None:
    def checksum(*args: str) -> str:
        # A fixed Redis password: a generated one differs between renders (and rightly rolls the pods).
        deployment, _ = _gateway(chart.render(set_values=["redis.auth.password=fixed", *args]))
        annotations: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/config"]

    assert checksum() == checksum()
    assert checksum() != checksum("gateway.config.server.first_byte_timeout_s=30")
    # Key rotation needs no restart: the mounted file is refreshed by the kubelet and re-read by the gateway.
    deployment, _ = _gateway(chart.render(set_values=[f"gateway.apiKeys.adminKeyHashes={{sha256:{'f' * 64}}}"]))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert all("subPath" not in m for m in container["volumeMounts"]), "subPath mounts never see Secret updates"
    old_key, new_key = (f"gateway.apiKeys.adminKeyHashes={{sha256:{c * 64}}}" for c in "fe")
    assert checksum(old_key) == checksum(new_key)


def test_probe_and_metrics_paths_are_served_by_the_gateway_app(chart: Any, tmp_path: Path) -> None:
    """The Deployment's probes, the ServiceMonitor, `helm test` and the NOTES' first request hit paths
    that the real app built from the rendered config answers; the readiness probe passes with no engine
    at all (a gateway in front of an empty or scaled-to-zero fleet must stay in its Service)."""
    from starlette.testclient import TestClient

    from fleetgate.core.kvstore import MemoryKVStore
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.discovery import StaticEndpointSource
    from fleetgate.gateway.stages import OpenAuth

    rendered = chart.render(set_values=["serviceMonitor.enabled=true"])
    deployment, configmap = _gateway(rendered)
    settings = _load_settings(configmap, tmp_path)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.server.metrics_port == ports["metrics"] != settings.server.port == ports["http"]
    # Tests listen on loopback and a free port; the paths are what matters here.
    settings.server.metrics_port, settings.server.metrics_host = 0, "127.0.0.1"
    # Only what needs a cluster or Redis is replaced; everything else is the real app factory.
    app = create_app(settings, endpoint_source=StaticEndpointSource([]), auth=OpenAuth(), kvstore=MemoryKVStore())
    (monitor,) = rendered.of_kind("ServiceMonitor")
    (test_pod,) = rendered.component("Pod", "test")
    script = test_pod["spec"]["containers"][0]["command"][-1]
    checks = [("client" if base == "base" else base, path)
              for base, path in re.findall(r'\b(base|metrics) \+ "(/[a-z0-9/]+)"', script)]
    tested = {path for base, path in checks if base == "client"}
    assert tested and ("metrics", "/metrics") in checks, "the helm test Pod checks no path"
    with TestClient(app, raise_server_exceptions=False) as client:  # runs the app's start-up
        ready = container["readinessProbe"]["httpGet"]["path"]
        assert client.get(ready).status_code == 200, "not ready without engines: kept out of the Service"
        paths = {container["livenessProbe"]["httpGet"]["path"]}
        for path in sorted(paths | tested | {"/v1/models"}):
            assert client.get(path).status_code not in {404, 405}, path
        metrics_base = app.state.metrics_listener.url.removesuffix("/metrics")
        scraped = {e["path"] for e in monitor["spec"]["endpoints"]} | {p for b, p in checks if b == "metrics"}
        for path in scraped:  # on the metrics port, absent from the client one
            assert httpx.get(metrics_base + path).status_code == 200, path
            assert client.get(path).status_code == 404, path
        assert client.post("/v1/chat/completions", content=b"{}").status_code not in {404, 405}


@pytest.mark.parametrize("password", ["", "p@ss word/with:\"odd\" chars"])
async def test_bundled_redis_auth_works_end_to_end(chart: Any, tmp_path: Path, password: str) -> None:
    """redis-server started as the StatefulSet starts it (its config file from the chart's Secret) refuses
    anonymous clients and accepts the gateway's KV store built from the rendered redis_url."""
    import redis.asyncio as aioredis

    from fleetgate.core.kvstore import make_kvstore
    from fleetgate.core.localredis import free_port

    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    args = ["redis.persistence.enabled=false"] + ([f"redis.auth.password={password}"] if password else [])
    rendered = chart.render(set_values=args)
    (sts,) = rendered.of_kind("StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    (secret,) = rendered.component("Secret", "redis")
    conf = tmp_path / "auth.conf"
    conf.write_bytes(base64.b64decode(secret["data"]["auth.conf"]))
    port = free_port()
    command = [str(conf) if a == "/etc/redis/auth.conf" else a for a in container["command"]]
    command = [str(tmp_path) if a == "/data" else a for a in command]
    command[command.index("--port") + 1] = str(port)
    proc = await asyncio.create_subprocess_exec(
        *command, "--bind", "127.0.0.1", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        _, configmap = _gateway(rendered)
        url = urlsplit(_load_settings(configmap, tmp_path).redis_url or "")
        local_url = url._replace(netloc=f":{url.password}@127.0.0.1:{port}").geturl()
        store = make_kvstore(local_url)
        deadline = time.monotonic() + 10
        while not await store.ping():
            assert time.monotonic() < deadline, "redis-server did not accept the gateway's URL"
            await asyncio.sleep(0.05)
        await store.set("k", b"v")
        assert await store.get("k") == b"v"
        await store.close()
        anonymous = aioredis.Redis(host="127.0.0.1", port=port)
        with pytest.raises(redis.exceptions.AuthenticationError):
            await anonymous.get("fg:k")
        await anonymous.aclose()
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)


def test_a_credential_in_the_config_keeps_it_out_of_configmaps(chart: Any) -> None:
    def holder(*args: str) -> str:
        _, config = _gateway(chart.render(set_values=list(args)))
        return str(config["kind"])

    external = ["redis.enabled=false", "gateway.replicas=3"]
    assert holder(*external, "redis.externalUrl=rediss://:s3cret@cache.internal:6380/0") == "Secret"
    assert holder(*external, "redis.externalUrl=redis://cache.internal:6379/0") == "ConfigMap"
    assert holder("redis.auth.enabled=false") == "ConfigMap"
    assert holder() == "Secret"
    for obj in chart.render(set_values=["redis.auth.password=s3cret-value"]).of_kind("ConfigMap"):
        assert "s3cret-value" not in json.dumps(obj), obj["metadata"]["name"]


def test_values_expose_every_gateway_config_section() -> None:
    """gateway.config accepts each section of GatewaySettings except the ones the chart fills in itself; a
    new section in the gateway fails here until values.schema.json lets users set it."""
    schema = json.loads((Path(__file__).resolve().parents[2] / "charts/fleetgate/values.schema.json").read_text())
    allowed = set(schema["properties"]["gateway"]["properties"]["config"]["properties"])
    assert allowed | {"discovery", "redis_url", "epp"} == set(GatewaySettings.model_fields)  # epp: from epp.*


@pytest.mark.parametrize(("auth", "models_status", "passes"), [
    ("api_key", 401, True), ("api_key", 200, False), ("open", 200, True), ("api_key", 404, False),
])  # fmt: skip
def test_helm_test_pod_checks_health_and_auth_and_is_always_deleted(
    chart: Any, auth: str, models_status: int, passes: bool
) -> None:
    """The `helm test` Pod's own script, run against a stub gateway on loopback: it passes when /healthz (and
    /metrics on the metrics Service) is 200 and /v1/models without a key is 401 under api_key (200 when
    open), fails otherwise; and the Pod is deleted whatever the outcome (no failed Pod left behind)."""
    import http.server
    import subprocess
    import sys
    import threading

    values = ["gateway.apiKeys.adminKeyHashes={sha256:" + "0" * 64 + "}"] if auth == "api_key" else []
    if auth == "open":
        values.append("gateway.config.server.auth=open")
    (pod,) = chart.render(set_values=values).component("Pod", "test")
    policy = set(pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(","))
    assert {"hook-succeeded", "hook-failed", "before-hook-creation"} <= policy

    class Stub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path in ("/healthz", "/metrics") else models_status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = pod["spec"]["containers"][0]["command"][-1]
        for name in ("base", "metrics"):  # the stub stands in for both Services
            script = re.sub(rf'{name} = "[^"]+"', f'{name} = "http://127.0.0.1:{server.server_port}"', script)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
    assert (proc.returncode == 0) is passes, proc.stdout + proc.stderr


def test_naming_the_cache_encoder_points_the_semantic_cache_at_it(chart: Any, tmp_path: Path) -> None:
    """gateway.cacheEncoder merges into whatever cache section the values give; empty, nothing changes."""
    scenario = Path(__file__).resolve().parents[2] / "charts/fleetgate/ci/cache-encoder-values.yaml"
    _, configmap = _gateway(chart.render(values=[scenario]))
    cache = _load_settings(configmap, tmp_path).cache
    assert cache.enabled and cache.ttl_s == 600 and cache.semantic.threshold == 0.55  # the values' own settings
    assert cache.semantic.embedder == "remote"
    assert (cache.semantic.remote.model, cache.semantic.remote.url, cache.semantic.remote.timeout_ms) == (
        "all-minilm-l6-v2", None, 80)  # no url: the encoder's pods, from discovery
    _, configmap = _gateway(chart.render(values=[scenario], set_values=[
        "gateway.cacheEncoder.url=http://all-minilm-l6-v2.models:8000"]))
    assert _load_settings(configmap, tmp_path).cache.semantic.remote.url == "http://all-minilm-l6-v2.models:8000"
    _, configmap = _gateway(chart.render())
    assert not _load_settings(configmap, tmp_path).cache.enabled  # no encoder named, no cache section: off
