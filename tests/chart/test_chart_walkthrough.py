"""The Helm walkthroughs (the README's quick start and the Kubernetes guide), as written: its `my-values.yaml`
(keys made by its shell lines) renders,
and the gateway built from the rendered config and keys Secret lets the tenant key list and call the
example model, while the admin key sees no model and a missing key gets 401."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.core.config import load_model
from fleetgate.gateway.settings import GatewaySettings, ModelRoute

REPO = Path(__file__).resolve().parents[2]


# Each document that tells a user how to write my-values.yaml, and the heading of that walkthrough.
WALKTHROUGHS = [("README.md", "## Kubernetes quick start"), ("docs/guides/kubernetes.md", "## Install with Helm")]


def _walkthrough_values(document: str, heading: str, *, admin: str, team: str) -> str:
    text = (REPO / document).read_text()
    assert heading in text, f"{document} lost its Helm walkthrough ({heading!r})"
    section = text[text.index(heading):]
    heredoc = re.search(r"cat > my-values.yaml <<(\w+)\n(.*?)\n\s*\1\n", section, re.S)
    assert heredoc, f"the Helm walkthrough in {document} writes no my-values.yaml"
    lines = heredoc.group(2).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    text = "\n".join(line[indent:] for line in lines)

    def shell_hash(key: str) -> str:
        return "sha256:" + hashlib.sha256(key.encode()).hexdigest()

    text = text.replace('$(hash "$ADMIN_KEY")', shell_hash(admin)).replace('$(hash "$TEAM_KEY")', shell_hash(team))
    assert "$" not in text, f"unexpanded shell in my-values.yaml:\n{text}"
    return text


@pytest.mark.parametrize(("document", "heading"), WALKTHROUGHS, ids=[d for d, _ in WALKTHROUGHS])
def test_walkthrough_tenant_key_lists_and_calls_the_example_model(
    chart: Any, tmp_path: Path, document: str, heading: str
) -> None:
    from fastapi.testclient import TestClient

    from fleetgate.core.kvstore import MemoryKVStore
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.discovery import StaticEndpointSource

    admin, team = "fg-admin-" + "a" * 32, "fg-team-" + "b" * 32
    values = tmp_path / "my-values.yaml"
    values.write_text(_walkthrough_values(document, heading, admin=admin, team=team))
    rendered = chart.render(values=[values])
    (holder,) = [o for o in rendered.component("ConfigMap", "gateway") + rendered.component("Secret", "gateway")
                 if "gateway.yaml" in (o.get("data") or o.get("stringData") or {})]  # fmt: skip
    config = yaml.safe_load((holder.get("data") or holder["stringData"])["gateway.yaml"])
    assert config["server"]["auth"] == "api_key"
    (keys_secret,) = [s for s in rendered.of_kind("Secret") if s["metadata"]["name"].endswith("gateway-keys")]
    keys_path = tmp_path / "keys.yaml"
    keys_path.write_text(keys_secret["stringData"]["keys.yaml"])
    config["tenancy"]["keys_file"] = str(keys_path)  # the mounted Secret, here on disk
    # The chart's metrics port (9464) is the pod's own; here any free port (0), so a busy 9464 on the test
    # machine cannot fail the test.
    config["server"]["metrics_port"] = 0
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    settings = load_model(GatewaySettings, config_path)

    example = yaml.safe_load((REPO / "examples" / "cpu-gemma-270m.yaml").read_text())
    model = example["spec"]["model"]["servedName"]
    source = StaticEndpointSource([ModelRoute(name=model, endpoints=["http://127.0.0.1:9"])])
    app = create_app(settings, endpoint_source=source, kvstore=MemoryKVStore())
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello"}]}
    with TestClient(app, raise_server_exceptions=False) as client:
        listed = client.get("/v1/models", headers={"Authorization": f"Bearer {team}"})
        assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [model]
        called = client.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {team}"})
        assert called.status_code not in (401, 403, 404), called.text  # authorized; no engine runs here
        as_admin = client.get("/v1/models", headers={"Authorization": f"Bearer {admin}"})
        assert as_admin.status_code == 200 and as_admin.json()["data"] == []  # as the README says
        assert client.get("/v1/models").status_code == 401
