"""`fleetgate epp --envoy-config`: the printed bootstrap is one the real Envoy accepts, in both failure modes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fleetgate.bench.envoy import MISSING, envoy_binary
from fleetgate.cli import main


@pytest.mark.parametrize("mode", ["FailClose", "FailOpen"])
def test_printed_bootstrap_validates_with_envoy(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    binary = envoy_binary()
    if binary is None:
        pytest.fail(MISSING)
    config = tmp_path / "gateway.yaml"
    config.write_text("models:\n  - {name: m1, endpoints: ['http://10.0.0.5:8000', 'http://10.0.0.6:8001']}\n"
                      "epp: {host: 0.0.0.0, port: 9102}\n")
    argv = ["epp", "--config", str(config), "--envoy-config", "--failure-mode", mode, "--listen", "0.0.0.0:18081"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    bootstrap = tmp_path / "envoy.yaml"
    bootstrap.write_text(printed)
    checked = subprocess.run([binary, "--mode", "validate", "-c", str(bootstrap)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    clusters = {c["name"]: c for c in yaml.safe_load(printed)["static_resources"]["clusters"]}
    epp = clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert epp["socket_address"] == {"address": "127.0.0.1", "port_value": 9102}  # 0.0.0.0 is where it listens
    assert ("pool" in clusters) is (mode == "FailOpen")  # FailClose never routes around the picker
