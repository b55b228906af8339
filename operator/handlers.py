"""Kopf wiring, and nothing else: the only module that imports Kopf.

`register()` puts the handlers into a registry (a fresh one per operator, so tests run several):
- login: the given function, else Kopf's own in-cluster or kubeconfig login;
- startup: Kopf settings (progress and diff-base in annotations, not in status; peering set by the caller),
  the API client and the optional-API check (KEDA, Prometheus Operator); cleanup closes the client;
- resume/create/update of an InferenceService: `Reconciler.reconcile`; an invalid spec becomes
  `kopf.PermanentError` (status and Event already written), pods still starting become
  `kopf.TemporaryError` (retried, with the status current meanwhile);
- events of InferenceServices whose generation is ahead of status.observedGeneration: reconcile at once
  (a spec edit while the change handler waits out a retry delay);
- events of engine Deployments: `Reconciler.refresh_status` on the owning InferenceService, so readiness
  shows in status within a watch event, not a retry period.
No status is returned from handlers (Kopf would write it under status.<handler>): the reconciler owns status.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import kopf

from fleetgate.engine.kube_names import GROUP, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, VERSION
from fleetgate.operator.kube import KubeApi
from fleetgate.operator.reconciler import Reconciler, SpecRejected
from fleetgate.operator.settings import Capabilities, OperatorSettings

WAIT_RETRY_S = 10.0
WAIT_RETRY_MAX_S = 60.0
ANNOTATION_PREFIX = "fleetgate.io"

LoginFn = Callable[..., Any]


def register(
    *,
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    make_api: Callable[[], KubeApi],
    login: LoginFn | None = None,
    detect_capabilities: bool = True,
) -> None:
    kopf.on.login(registry=registry)(login or kopf.login_with_service_account)
    if login is None:
        kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)

    @kopf.on.startup(registry=registry)
    async def _startup(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        # The reconciler posts the Events that matter (InvalidSpec, DoesNotFit, ...); Kopf's own would add one
        # per retry while pods start ("failed temporarily"), which is noise in `kubectl describe`.
        settings.posting.enabled = False
        api = make_api()
        effective = operator_settings
        if detect_capabilities:
            caps = Capabilities(
                keda=await api.crd_exists(name="scaledobjects.keda.sh"),
                service_monitor=await api.crd_exists(name="servicemonitors.monitoring.coreos.com"),
            )
            effective = dataclasses.replace(operator_settings, capabilities=caps)
        memo.api = api
        memo.reconciler = Reconciler(api=api, settings=effective)

    operator_settings = settings

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
        api = getattr(memo, "api", None)
        if api is not None:
            await api.aclose()

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def _reconcile(body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
        reconciler: Reconciler = memo.reconciler
        try:
            outcome = await reconciler.reconcile(_plain(body))
        except SpecRejected as exc:
            raise kopf.PermanentError(f"invalid spec: {exc}") from None
        if outcome.waiting:
            # Model loading takes minutes: back off (10 s, 20 s, ... 60 s). Status stays current meanwhile through
            # the Deployment events, and spec edits are applied at once by `_spec_changed`.
            delay = min(WAIT_RETRY_MAX_S, WAIT_RETRY_S * (retry + 1))
            raise kopf.TemporaryError(f"waiting for engine pods: {outcome.status['ready']} ready", delay=delay)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def _spec_changed(body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any) -> None:
        """A spec edit while `_reconcile` waits out a retry delay is applied now, not at the next retry."""
        if type == "DELETED" or not hasattr(memo, "reconciler"):
            return
        generation = body.get("metadata", {}).get("generation")
        observed = (body.get("status") or {}).get("observedGeneration")
        if observed is None or generation == observed:
            return  # never reconciled yet (the create handler does it) or already current
        with contextlib.suppress(SpecRejected):  # the change handler reports invalid specs (condition + Event)
            await memo.reconciler.reconcile(_plain(body))

    @kopf.on.event("apps", "v1", "deployments", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
    async def _deployment_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(LABEL_INSTANCE)
        namespace = body.get("metadata", {}).get("namespace")
        if not owner or not namespace or not hasattr(memo, "reconciler"):
            return
        api: KubeApi = memo.api
        isvc = await api.get_inference_service(namespace=namespace, name=owner)
        if isvc is not None:
            await memo.reconciler.refresh_status(isvc, deployment=_plain(body))


def _plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))
