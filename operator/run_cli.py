"""`fleetgate operator`: run the InferenceService operator (Kopf) against the cluster.

Two operators never fight: Kopf peering through the one cluster-wide `ClusterKopfPeering` named by
`--peering` (default `fleetgate`, the chart's too) lets the highest `--priority` work and pauses the
others, whichever namespaces each watches. The operator creates the peering object when it is missing;
without the peering CRD (`fleetgate crd --peering | kubectl apply -f -`, shipped in the chart) it runs
standalone and says so at WARNING. `--standalone` turns peering off on purpose.
Logs go to stderr at `--log-level` (INFO by default: a paused or waiting operator says so).
`/healthz` listens on 127.0.0.1:8081 by default (`--liveness-port`): not 8080, the gateway's default port,
so the two run side by side on one machine; a port already taken stops the operator at start with a
message, before Kopf would fail on it.
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

# Kubebuilder's health-probe port; 8080 is the gateway's (`server.port`) and 9464 its metrics port.
DEFAULT_LIVENESS_PORT = 8081


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
    parser.add_argument(
        "--engine-run-as-user", type=_uid, default=OperatorSettings().engine_run_as_user, metavar="UID|none",
        help="UID (and GID, fsGroup) of engine pods (default 1000: the vLLM images run as root otherwise, which "
        "Pod Security 'restricted' refuses); none: leave them to the platform (OpenShift assigns them)",
    )  # fmt: skip
    parser.add_argument("--profiles", type=Path, help="accelerator profiles YAML (overrides the built-ins)")
    parser.add_argument("--default-accelerator", default=DEFAULT_ACCELERATOR)
    parser.add_argument("--prometheus-url", default=OperatorSettings().prometheus_url, help="for KEDA triggers")
    parser.add_argument(
        "--liveness-port", type=int, default=DEFAULT_LIVENESS_PORT,
        help=f"serve /healthz on this port (default {DEFAULT_LIVENESS_PORT}; 0: off)",
    )  # fmt: skip
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
    taken = port_taken(host=args.liveness_host, port=args.liveness_port)
    if taken is not None:
        logging.getLogger("fleetgate.operator").error(
            "cannot serve /healthz on %s:%d (%s): pass --liveness-port with a free port, or 0 for none",
            args.liveness_host, args.liveness_port, taken,
        )
        return 2
    settings = OperatorSettings(
        engine_image=args.engine_image,
        profiles=load_profiles(path=args.profiles, default=args.default_accelerator),
        prometheus_url=args.prometheus_url,
        engine_run_as_user=args.engine_run_as_user,
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


def _uid(value: str) -> int | None:
    if value.lower() == "none":
        return None
    uid = int(value)
    if uid < 1:
        raise argparse.ArgumentTypeError("a non-root UID (>= 1), or none")
    return uid


def port_taken(*, host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (in use, not an address here), or None when it can (or port 0)."""
    if not port:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def liveness_endpoint(*, host: str, port: int) -> str | None:
    """Kopf's liveness URL (None: no probe endpoint); IPv6 addresses are bracketed."""
    if not port:
        return None
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
