"""`fleetgate operator`: run the InferenceService operator (Kopf) against the cluster.

Two operators never fight: Kopf peering through the one cluster-wide `ClusterKopfPeering` named by
`--peering` (default `fleetgate`, the chart's too) lets the highest `--priority` work and pauses the
others, whichever namespaces each watches. The operator creates the peering object when it is missing;
without the peering CRD (`fleetgate crd --peering | kubectl apply -f -`, shipped in the chart) it runs
standalone and says so at WARNING. `--standalone` turns peering off on purpose.
Logs go to stderr at `--log-level` (INFO by default: a paused or waiting operator says so).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import logging
import os
import secrets
import socket
from pathlib import Path

from fleetgate.operator.profiles import DEFAULT_ACCELERATOR, load_profiles
from fleetgate.operator.settings import DEFAULT_ENGINE_IMAGE, OperatorSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", default="fleetgate", help="ClusterKopfPeering name, created if missing (default: fleetgate)"
    )
    peering.add_argument("--standalone", action="store_true", help="no peering: only ever run one replica")
    parser.add_argument(
        "--priority", type=int, default=0, help="peering priority: the highest works, the others pause (chart: 0)"
    )
    parser.add_argument("--engine-image", default=DEFAULT_ENGINE_IMAGE, help="default vLLM engine image")
    parser.add_argument("--profiles", type=Path, help="accelerator profiles YAML (overrides the built-ins)")
    parser.add_argument("--default-accelerator", default=DEFAULT_ACCELERATOR)
    parser.add_argument("--prometheus-url", default=OperatorSettings().prometheus_url, help="for KEDA triggers")
    parser.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz on this port (0: off)")
    parser.add_argument(
        "--liveness-host", default="127.0.0.1", help="address of /healthz (the chart sets 0.0.0.0 for the kubelet)"
    )
    parser.add_argument(
        "--epp-service", help="publish an InferencePool per InferenceService, naming this Endpoint Picker Service "
        "(in each service's namespace); default: publish none"
    )
    parser.add_argument("--epp-port", type=int, default=9002, help="the Endpoint Picker Service's port")
    parser.add_argument("--epp-failure-mode", choices=("FailClose", "FailOpen"), default="FailClose",
                        help="the pools' failureMode: what a gateway does when the picker does not answer")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    import kopf

    from fleetgate.operator.handlers import register
    from fleetgate.operator.kube import KubeApi

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = OperatorSettings(
        engine_image=args.engine_image,
        profiles=load_profiles(path=args.profiles, default=args.default_accelerator),
        prometheus_url=args.prometheus_url,
        epp_service=args.epp_service,
        epp_port=args.epp_port,
        epp_failure_mode=args.epp_failure_mode,
    )
    registry = kopf.OperatorRegistry()
    identity = peering_identity()
    register(
        registry=registry,
        settings=settings,
        make_api=lambda: KubeApi.from_env(field_manager=settings.field_manager),
        identity=identity,
    )
    kopf.run(
        registry=registry,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        liveness_endpoint=liveness_endpoint(host=args.liveness_host, port=args.liveness_port),
        memo=kopf.Memo(),
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str, not exported
    )
    return 0


def peering_identity() -> str:
    """This process's peering identity, as Kopf builds one (the pod name from `POD_ID` in a cluster), made
    here so the operator's own background tasks can tell themselves apart from their peers."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    started = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
    return f"{getpass.getuser()}@{socket.gethostname()}/{started}/{secrets.token_hex(2)}"


def liveness_endpoint(*, host: str, port: int) -> str | None:
    """Kopf's liveness URL (None: no probe endpoint); IPv6 addresses are bracketed."""
    if not port:
        return None
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
