"""NOTES.txt tells the user how to reach the gateway and send a first request."""

from __future__ import annotations

from typing import Any

A_HASH = "sha256:" + "cd" * 32


def test_notes_show_port_forward_and_a_first_request(chart: Any) -> None:
    notes = chart.notes()
    assert "kubectl -n fleet port-forward svc/fg-fleetgate-gateway 8080:80" in notes
    assert "curl -s http://127.0.0.1:8080/v1/chat/completions" in notes
    assert "Authorization: Bearer $FLEETGATE_API_KEY" in notes
    assert "no API keys are configured" in notes
    assert "kubectl apply --server-side -f charts/fleetgate/crds/" in notes


def test_notes_follow_the_values(chart: Any) -> None:
    notes = chart.notes(
        set_values=["gateway.service.port=8000", "redis.enabled=false", "gateway.replicas=1",
                    f"gateway.apiKeys.adminKeyHashes={{{A_HASH}}}", "operator.watchAllNamespaces=true"]
    )
    assert "port-forward svc/fg-fleetgate-gateway 8080:8000" in notes
    assert "no API keys are configured" not in notes
    assert "Secret\nfg-fleetgate-gateway-keys" in notes or "fg-fleetgate-gateway-keys" in notes
    assert "lost on restart" in notes
    assert "every namespace" in notes
    assert "port-forward" not in chart.notes(set_values=["gateway.enabled=false"])
