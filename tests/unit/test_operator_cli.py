"""`fleetgate plan` and `fleetgate crd` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fleetgate.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_plan_prints_the_numbers_and_exits_0_when_it_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "llama-70b-h100-tp4.yaml")]) == 0
    out = capsys.readouterr().out
    assert "35.27 GB per GPU" in out and "fits:               yes" in out
    assert "--tensor-parallel-size 4" in out


def test_plan_exits_1_when_a_spec_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "small-l4-awq.yaml"), str(EXAMPLES / "does-not-fit.yaml")]) == 1
    assert "weights do not fit" in capsys.readouterr().out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", str(EXAMPLES / "small-l4-awq.yaml")]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    target = yaml.safe_load((EXAMPLES / "small-l4-awq.yaml").read_text())["spec"]["engine"]["maxNumSeqs"]
    assert result["plan"]["fits"] is True and result["plan"]["maxConcurrentSequences"] >= target


def test_plan_rejects_an_invalid_file_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "InferenceService", "metadata": {"name": "x"}, "spec": {"model": {}}}))
    assert main(["plan", str(bad)]) == 2
    assert "model.source" in capsys.readouterr().err


def test_crd_command_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    crd = yaml.safe_load(capsys.readouterr().out)
    assert crd["metadata"]["name"] == "inferenceservices.fleetgate.io"


def test_operator_liveness_endpoint_host_and_port_are_configurable() -> None:
    import argparse

    from fleetgate.operator import run_cli

    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    defaults = parser.parse_args([])
    assert run_cli.liveness_endpoint(host=defaults.liveness_host, port=defaults.liveness_port) == (
        "http://127.0.0.1:8081/healthz"  # loopback unless told otherwise (the chart says 0.0.0.0)
    )
    args = parser.parse_args(["--liveness-host", "::", "--liveness-port", "9090"])
    assert run_cli.liveness_endpoint(host=args.liveness_host, port=args.liveness_port) == "http://[::]:9090/healthz"
    assert run_cli.liveness_endpoint(host="0.0.0.0", port=0) is None


def test_operator_and_gateway_defaults_use_different_ports() -> None:
    """Defect: both defaulted to 8080, so a gateway started beside `fleetgate operator` died on bind."""
    import argparse

    from fleetgate.gateway.settings import ServerSettings
    from fleetgate.operator import run_cli

    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    operator_port = parser.parse_args([]).liveness_port
    gateway = ServerSettings()
    assert operator_port not in (gateway.port, gateway.metrics_port)


def test_operator_with_its_liveness_port_taken_stops_at_once_with_a_message(caplog: pytest.LogCaptureFixture) -> None:
    import argparse
    import socket

    from fleetgate.operator import run_cli

    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = parser.parse_args(["--liveness-port", str(port), "--standalone"])
        assert run_cli.run(args) == 2  # before Kopf starts: no cluster is contacted
    assert f"127.0.0.1:{port}" in caplog.text and "--liveness-port" in caplog.text
    assert run_cli.port_taken(host="127.0.0.1", port=port) is None  # released: free again


def test_engine_uid_flag_reaches_the_settings_and_refuses_root() -> None:
    import argparse

    from fleetgate.operator import run_cli

    parser = argparse.ArgumentParser(exit_on_error=False)
    run_cli.add_arguments(parser)
    assert parser.parse_args([]).engine_run_as_user == 1000
    assert parser.parse_args(["--engine-run-as-user", "none"]).engine_run_as_user is None
    assert parser.parse_args(["--engine-run-as-user", "2000"]).engine_run_as_user == 2000
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["--engine-run-as-user", "0"])
