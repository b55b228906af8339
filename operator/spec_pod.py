"""`spec.pod`: typed settings of the engine pods, over defaults that meet the `restricted` Pod Security
Standard (the defaults and how these settings combine with them: `fleetgate.operator.builders.pod_security`).

Only what platform teams set on engine pods is offered, each field typed as in the Kubernetes API: the pod's
and the engine container's security context, a ServiceAccount, image pull Secrets, a node selector and
tolerations added to the accelerator profile's, a priority class, a runtime class (e.g. `nvidia`), and
extra labels and annotations. Labels the operator selects pods by are refused (the Deployment's selector
would no longer match its own pods).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from fleetgate.engine.kube_names import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_ISVC,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
)
from fleetgate.operator.spec_base import Model, rules

RESERVED_LABELS = (LABEL_NAME, LABEL_INSTANCE, LABEL_COMPONENT, LABEL_PART_OF, LABEL_MANAGED_BY, LABEL_ISVC)
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Capability = Annotated[str, StringConstraints(pattern=r"^[A-Z_]+$", max_length=64)]
ObjectName = Annotated[str, StringConstraints(pattern=_DNS_SUBDOMAIN, max_length=253)]


class SeccompProfile(Model):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.type != 'Localhost' || has(self.localhostProfile)",
                "seccompProfile type Localhost needs localhostProfile",
            ),
        )
    )  # fmt: skip
    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(
        description="RuntimeDefault (the container runtime's profile; the default), Localhost or Unconfined."
    )
    localhost_profile: str | None = Field(
        default=None, max_length=253, description="Profile file on the node, relative to the kubelet's seccomp folder."
    )

    @model_validator(mode="after")
    def _localhost(self) -> SeccompProfile:
        if self.type == "Localhost" and not self.localhost_profile:
            raise ValueError("seccompProfile type Localhost needs localhostProfile")
        return self


class PodSecurityContext(Model):
    """Pod-level security context; each field set here replaces the operator's default for it."""

    run_as_user: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="UID of the engine process (default: the operator's, 1000)."
    )
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Primary GID (default 1000).")
    fs_group: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="GID that owns the mounted volumes (default 1000)."
    )
    run_as_non_root: bool | None = Field(
        default=None, description="Refuse to start a container as UID 0 (default true; restricted requires it)."
    )
    supplemental_groups: list[int] = Field(
        default_factory=list, max_length=32, description="Extra GIDs of the engine process."
    )
    seccomp_profile: SeccompProfile | None = Field(
        default=None, description="Seccomp profile (default RuntimeDefault; restricted requires one)."
    )


class Capabilities(Model):
    add: list[Capability] = Field(
        default_factory=list, max_length=32,
        description="Linux capabilities to add (restricted allows NET_BIND_SERVICE only).",
    )  # fmt: skip
    drop: list[Capability] = Field(
        default_factory=list, max_length=64, description="Linux capabilities to drop (default ALL)."
    )


class ContainerSecurityContext(Model):
    """The engine container's security context; each field set here replaces the operator's default for it."""

    allow_privilege_escalation: bool | None = Field(
        default=None, description="Default false (restricted requires false)."
    )
    read_only_root_filesystem: bool | None = Field(
        default=None,
        description="Default unset (false): vLLM and PyTorch write caches under /tmp; the model cache and HOME "
        "are volumes either way.",
    )
    privileged: bool | None = Field(default=None, description="Default unset (false); restricted forbids true.")
    capabilities: Capabilities | None = Field(default=None, description="Default: drop ALL.")


class Toleration(Model):
    key: str | None = Field(default=None, max_length=317, description="Taint key; empty with Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; every effect when unset."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="NoExecute only: how long the pod stays bound after the taint appears."
    )


class PodSettings(Model):
    """Settings of the engine pods (see the module docstring)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                f"!has(self.labels) || self.labels.all(k, !(k in [{', '.join(repr(k) for k in RESERVED_LABELS)}]))",
                "pod.labels may not set the labels the operator selects engine pods by",
            ),
        )
    )  # fmt: skip
    security_context: PodSecurityContext | None = Field(
        default=None, description="Pod security context, over the restricted defaults."
    )
    container_security_context: ContainerSecurityContext | None = Field(
        default=None, description="Engine container security context, over the restricted defaults."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=_DNS_SUBDOMAIN,
        description="ServiceAccount of the engine pods (default: the namespace's default).",
    )  # fmt: skip
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list, max_length=16, description="Names of Secrets to pull the engine image with."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods need, added to the accelerator profile's."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints tolerated, added to the accelerator profile's."
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=_DNS_SUBDOMAIN, description="PriorityClass of the engine pods."
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, pattern=_DNS_SUBDOMAIN, description="RuntimeClass (e.g. nvidia)."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra pod labels (not the ones the operator selects pods by)."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra pod annotations; the operator's own (prometheus.io/*) win."
    )

    @model_validator(mode="after")
    def _labels(self) -> PodSettings:
        taken = sorted(set(self.labels) & set(RESERVED_LABELS))
        if taken:
            raise ValueError(
                f"pod.labels may not set the labels the operator selects engine pods by: {', '.join(taken)}"
            )
        return self
