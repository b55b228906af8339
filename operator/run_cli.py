"""`fleetgate operator`: run the InferenceService operator (Kopf) against the cluster.

Two replicas never fight: by default Kopf peering (`--peering fleetgate`) lets the highest-priority
replica work and pauses the others; the peering CRDs and one peering object ship with the Helm chart.
`--standalone` turns peering off (one replica, development).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetgate.operator.profiles import DEFAULT_ACCELERATOR, load_profiles
from fleetgate.operator.settings import DEFAULT_ENGINE_IMAGE, OperatorSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", default="fleetgate", help="Kopf peering object name (default: fleetgate)")
    peering.add_argument("--standalone", action="store_true", help="no peering: only ever run one replica")
    parser.add_argument("--priority", type=int, default=0, help="peering priority of this replica")
    parser.add_argument("--engine-image", default=DEFAULT_ENGINE_IMAGE, help="default vLLM engine image")
    parser.add_argument("--profiles", type=Path, help="accelerator profiles YAML (overrides the built-ins)")
    parser.add_argument("--default-accelerator", default=DEFAULT_ACCELERATOR)
    parser.add_argument("--prometheus-url", default=OperatorSettings().prometheus_url, help="for KEDA triggers")
    parser.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz on this port (0: off)")


def run(args: argparse.Namespace) -> int:
    import kopf

    from fleetgate.operator.handlers import register
    from fleetgate.operator.kube import KubeApi

    settings = OperatorSettings(
        engine_image=args.engine_image,
        profiles=load_profiles(path=args.profiles, default=args.default_accelerator),
        prometheus_url=args.prometheus_url,
    )
    registry = kopf.OperatorRegistry()
    register(
        registry=registry,
        settings=settings,
        make_api=lambda: KubeApi.from_env(field_manager=settings.field_manager),
    )
    kopf.run(
        registry=registry,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=kopf.Memo(),
    )
    return 0
