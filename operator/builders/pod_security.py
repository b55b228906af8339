"""Engine pods that meet the `restricted` Pod Security Standard by default, and `spec.pod` over them.

The restricted profile asks for: `runAsNonRoot: true` (and no UID 0), a seccomp profile (RuntimeDefault or
Localhost), `allowPrivilegeEscalation: false`, every capability dropped (only NET_BIND_SERVICE may be
added back), and only emptyDir, PVC, Secret, ConfigMap and similar volumes (the engine's are emptyDirs and
PVCs). vLLM allows all of it:
- the vLLM images (vllm/vllm-openai, and ours in engine_image/) run as root by default and have no other
  user, so `runAsNonRoot` alone would stop the kubelet ("image will run as root"): the pod sets a UID,
  `OperatorSettings.engine_run_as_user` (1000; None leaves UID and GIDs to the platform, as OpenShift's
  restricted SCC assigns them), with the same GID and fsGroup so the volumes are writable;
- that UID has no home folder and no passwd entry in the image: HOME points into the model cache
  emptyDir (vLLM, Triton, FlashInfer and torch.compile keep caches under ~/.cache), and USER is set
  because PyTorch's compile cache asks `getpass.getuser()`, which fails for a UID without a passwd entry;
- /dev/shm is a memory emptyDir and the model cache an emptyDir (both writable by any UID); the image's
  /tmp is world-writable, so the root filesystem stays writable by default (`readOnlyRootFilesystem` can
  be turned on in `spec.pod.containerSecurityContext` when the image allows it).

`spec.pod.securityContext` / `.containerSecurityContext`: each field set replaces that default (a whole
`seccompProfile` or `capabilities` object at once). `nodeSelector` and `tolerations` add to the
accelerator profile's; `labels` add to the operator's (never replace them: the CRD refuses the ones the
selector uses); `annotations` add to the pod template's, the operator's own win.
"""

from __future__ import annotations

from typing import Any

from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec_pod import PodSettings


def pod_security_context(*, pod: PodSettings, settings: OperatorSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"runAsNonRoot": True}
    uid = settings.engine_run_as_user
    if uid is not None:
        out.update(runAsUser=uid, runAsGroup=uid, fsGroup=uid)
    out["seccompProfile"] = {"type": "RuntimeDefault"}
    if pod.security_context is not None:
        out.update(_set_fields(pod.security_context.model_dump(by_alias=True, exclude_none=True)))
    return out


def container_security_context(*, pod: PodSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if pod.container_security_context is not None:
        out.update(_set_fields(pod.container_security_context.model_dump(by_alias=True, exclude_none=True)))
    return out


def _set_fields(dumped: dict[str, Any]) -> dict[str, Any]:
    """Fields the user set: empty lists are pydantic's defaults, not a choice."""
    return {key: value for key, value in dumped.items() if value != []}


def home_env(*, cache_mount: str) -> list[dict[str, str]]:
    """HOME and USER for a UID the image does not know (see the module docstring)."""
    return [{"name": "HOME", "value": cache_mount}, {"name": "USER", "value": "engine"}]


def apply_pod_settings(
    *, pod_spec: dict[str, Any], template_meta: dict[str, Any], pod: PodSettings, settings: OperatorSettings
) -> None:
    """Security contexts and `spec.pod` into a built pod template (its one container is the engine)."""
    pod_spec["securityContext"] = pod_security_context(pod=pod, settings=settings)
    for container in pod_spec["containers"]:
        container["securityContext"] = container_security_context(pod=pod)
    if pod.service_account_name:
        pod_spec["serviceAccountName"] = pod.service_account_name
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pod.image_pull_secrets]
    if pod.node_selector:
        pod_spec["nodeSelector"] = {**pod.node_selector, **pod_spec.get("nodeSelector", {})}
    if pod.tolerations:
        extra = [t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations]
        pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *extra]
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    if pod.runtime_class_name:
        pod_spec["runtimeClassName"] = pod.runtime_class_name
    if pod.labels:
        template_meta["labels"] = {**pod.labels, **template_meta["labels"]}
    if pod.annotations:
        template_meta["annotations"] = {**pod.annotations, **template_meta.get("annotations", {})}
