"""Pure manifest builders: a resolved InferenceService in, Kubernetes objects (plain dicts) out.

`build_children` is the one entry point; each kind has its own module. Every object carries the owner
reference (garbage collection on delete), the common labels and the spec hash the reconcile plan compares.
"""

from __future__ import annotations

from typing import Any

from fleetgate.operator.builders.autoscaler import build_autoscaler
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.builders.deployment import build_deployment
from fleetgate.operator.builders.monitoring import build_service_monitor
from fleetgate.operator.builders.service import build_pdb, build_service
from fleetgate.operator.resolve import Resolved
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import InferenceServiceSpec

__all__ = ["Owner", "build_children"]


def build_children(
    *, owner: Owner, spec: InferenceServiceSpec, resolved: Resolved, settings: OperatorSettings
) -> list[dict[str, Any]]:
    """Desired children in apply order: Service first (endpoints exist before pods), Deployment, the rest."""
    children = [
        build_service(owner=owner, spec=spec),
        build_deployment(owner=owner, spec=spec, resolved=resolved, settings=settings),
        build_pdb(owner=owner, spec=spec),
    ]
    autoscaler = build_autoscaler(owner=owner, spec=spec, settings=settings, served_model=resolved.served_model)
    if autoscaler is not None:
        children.append(autoscaler)
    if settings.capabilities.service_monitor:
        children.append(build_service_monitor(owner=owner))
    return children
