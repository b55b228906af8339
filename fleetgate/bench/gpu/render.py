"""From an InferenceService spec to the engine command, through the operator's own code path.

The operator validates a spec (`parse_spec`, `resolve`), plans its capacity and builds the engine
Deployment (`build_deployment`); the container's command, args and env there are what a pod runs. The
sweep takes exactly those and changes only what a pod does not decide for itself: the interpreter
(`python3` -> this one), the listen address (`--host 0.0.0.0 --port 8000` -> loopback and a free port,
one engine per port) and `HF_HOME` (the pod's cache mount -> a work directory). A spec the operator
refuses yields the status the operator would write (phase Invalid, Degraded/InvalidSpec) instead.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.operator.builders.common import Owner
from fleetgate.operator.builders.deployment import build_deployment
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import Resolved, resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec, validation_message
from fleetgate.operator.status import compute_status

NAMESPACE = "gpu-tier"


@dataclass(frozen=True, kw_only=True)
class Rendered:
    name: str
    resolved: Resolved | None = None
    command: list[str] = field(default_factory=list)  # as the pod runs it
    env: dict[str, str] = field(default_factory=dict)  # the pod's container env
    invalid: str | None = None  # the operator's refusal
    status: dict[str, Any] | None = None  # the status the operator writes for a refused spec

    def local_command(self, *, python: str, host: str, port: int) -> list[str]:
        """The pod's command with this interpreter and a loopback address (nothing else changed)."""
        args = list(self.command)
        args[0] = python
        for flag, value in (("--host", host), ("--port", str(port))):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        return args


def render(*, name: str, spec: Mapping[str, Any], profiles: Profiles) -> Rendered:
    """The engine command and env the operator's Deployment would run for `spec`, or its refusal."""
    owner = Owner(name=name, namespace=NAMESPACE, uid=f"{name}-uid")
    try:
        parsed = parse_spec(dict(spec))
        resolved = resolve(spec=parsed, name=name, profiles=profiles)
    except (ValidationError, ConfigError) as exc:
        message = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        status = compute_status(owner=owner, spec=None, resolved=None, invalid=message, deployment=None,
                                previous=None, now=dt.datetime.now(dt.UTC))  # fmt: skip
        return Rendered(name=name, invalid=message, status=status)
    settings = OperatorSettings(profiles=profiles)
    manifest = build_deployment(owner=owner, spec=parsed, resolved=resolved, settings=settings)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: str(item["value"]) for item in container.get("env", []) if "value" in item}
    return Rendered(name=name, resolved=resolved, command=[*container["command"], *container["args"]], env=env)
