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
        "http://127.0.0.1:8080/healthz"  # loopback unless told otherwise (the chart says 0.0.0.0)
    )
    args = parser.parse_args(["--liveness-host", "::", "--liveness-port", "9090"])
    assert run_cli.liveness_endpoint(host=args.liveness_host, port=args.liveness_port) == "http://[::]:9090/healthz"
    assert run_cli.liveness_endpoint(host="0.0.0.0", port=0) is None
