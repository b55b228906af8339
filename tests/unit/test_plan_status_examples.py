"""`status.capacityPlan` of every example InferenceService is exactly what `fleetgate plan --json` prints."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from fleetgate.operator import plan_cli
from fleetgate.operator.builders import Owner
from fleetgate.operator.profiles import DEFAULT_ACCELERATOR, Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_status_capacity_plan_is_the_plan_cli_output(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(path.read_text())
    name = doc["metadata"]["name"]
    spec = parse_spec(doc["spec"])
    resolved = resolve(spec=spec, name=name, profiles=Profiles())
    status = compute_status(
        owner=Owner(name=name, namespace="default", uid="u", generation=1),
        spec=spec,
        resolved=resolved,
        invalid=None,
        deployment=None,
        previous=None,
        now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    args = argparse.Namespace(
        files=[path], profiles=None, default_accelerator=DEFAULT_ACCELERATOR, json=True, strict=False
    )
    plan_cli.run(args)
    [printed] = json.loads(capsys.readouterr().out)
    assert printed["plan"] is not None, f"{path.stem}: every example has a capacity plan (CPU ones too)"
    assert status["capacityPlan"] == {**printed["plan"], "note": printed["note"]}
