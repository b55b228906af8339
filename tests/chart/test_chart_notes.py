"""NOTES.txt tells the user how to reach the gateway and send a first request."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fleetgate.gateway.tenancy.keys import hash_key

A_HASH = "sha256:" + "cd" * 32


def test_notes_show_port_forward_and_a_first_request(chart: Any) -> None:
    notes = chart.notes()
    assert "kubectl -n fleet port-forward svc/fg-fleetgate-gateway 8080:80" in notes
    assert "helm test fg -n fleet" in notes
    assert "curl -s http://127.0.0.1:8080/v1/chat/completions" in notes
    assert "Authorization: Bearer $FLEETGATE_API_KEY" in notes
    assert "No API keys are configured yet, so the gateway answers 401" in notes
    assert "kubectl apply --server-side -f charts/fleetgate/crds/" in notes


def test_notes_follow_the_values(chart: Any) -> None:
    notes = chart.notes(
        set_values=["gateway.service.port=8000", "redis.enabled=false", "gateway.replicas=1",
                    f"gateway.apiKeys.adminKeyHashes={{{A_HASH}}}", "operator.watchAllNamespaces=true"]
    )
    assert "port-forward svc/fg-fleetgate-gateway 8080:8000" in notes
    assert "No API keys are configured" not in notes
    assert "(Secret fg-fleetgate-gateway-keys)" in notes
    assert "lost on restart" in notes
    assert "every namespace" in notes
    assert "port-forward" not in chart.notes(set_values=["gateway.enabled=false"])
    assert 'auth is "open"' in chart.notes(set_values=["gateway.config.server.auth=open"])


def test_the_key_recipe_in_the_notes_produces_a_hash_the_gateway_accepts(chart: Any, tmp_path: Any) -> None:
    """Run the shell lines NOTES.txt prints and check the hash against the gateway's own hashing."""
    notes = chart.notes()
    lines = [ln.strip() for ln in notes.splitlines() if ln.strip().startswith(("KEY=", 'echo "hash'))]
    assert len(lines) == 2, notes
    out = subprocess.run(["bash", "-c", "; ".join(lines)],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines())
    key, digest = fields["key"].strip(), fields["hash"].strip()
    assert key.startswith("fg-") and digest == hash_key(key)


def test_readme_install_commands_match_the_rendered_names(chart: Any) -> None:
    """charts/fleetgate/README.md port-forwards to svc/fleetgate-gateway after `helm install fleetgate`."""
    readme = (Path(__file__).resolve().parents[2] / "charts" / "fleetgate" / "README.md").read_text()
    assert "port-forward svc/fleetgate-gateway 8080:80" in readme
    hashes = 'gateway.apiKeys.adminKeyHashes=["sha256:' + "e" * 64 + '"]'
    rendered = chart.render(release="fleetgate", namespace="fleetgate", set_json=[hashes])
    (service,) = rendered.component("Service", "gateway")
    assert service["metadata"]["name"] == "fleetgate-gateway"
    assert service["spec"]["ports"][0]["port"] == 80
