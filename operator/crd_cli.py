"""`fleetgate crd`: print (or write) the InferenceService CRD generated from the typed spec."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetgate.operator.crd import build_crd, peering_yaml, to_yaml

CHART_CRD_PATH = Path("charts/fleetgate/crds/inferenceservices.fleetgate.io.yaml")
CHART_PEERING_PATH = Path("charts/fleetgate/crds/kopf-peering.yaml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", type=Path, help=f"write to this file (e.g. {CHART_CRD_PATH}) instead of stdout"
    )
    parser.add_argument("--peering", action="store_true", help=f"Kopf's peering CRDs instead ({CHART_PEERING_PATH})")


def run(args: argparse.Namespace) -> int:
    text = peering_yaml() if args.peering else to_yaml(build_crd())
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0
