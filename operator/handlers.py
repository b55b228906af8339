"""Kopf wiring, and nothing else: the only module that imports Kopf.

`register()` puts the handlers into a registry (a fresh one per operator, so tests run several):
- login: the given function, else Kopf's own in-cluster or kubeconfig login;
- startup: Kopf settings (progress and diff-base in annotations, not in status), peering (below), the API
  client and the optional-API check (KEDA, Prometheus Operator); cleanup closes the client;
- peering: always the one cluster-scoped ClusterKopfPeering named by `--peering` (default `fleetgate`),
  whatever namespaces are watched, so the chart's operator and a developer's `--priority 100` operator
  see each other. The operator creates the object when it is missing; without the peering CRD (or the
  right to create the object) it runs standalone, and says so at WARNING. Kopf's own "pausing" message
  is raised to WARNING too: a paused operator must never be silent;
- resume/create/update of an InferenceService: `Reconciler.reconcile`. An invalid spec, a spec that does
  not fit and pods still loading are normal outcomes (status and Events say so), logged at INFO/WARNING,
  never raised: Kopf would log them at ERROR and retry what retrying cannot fix;
- a child the API server refused (ApplyFailed: status, Event) is a real error: `kopf.TemporaryError`,
  retried every `OperatorSettings.retry_failed_s`. A LoRA adapter that did not load on a ready pod
  (AdaptersReady False, an AdapterLoadFailed Event per new failure) and engine pods not all ready are the
  reconciler's own delayed re-checks (`fleetgate.operator.resync`, every `adapter_retry_s` / `pod_check_s`),
  not Kopf retries: those log at ERROR each time and hold back the next spec change. (No Kopf timer for a
  periodic resync: Kopf puts a finalizer on every object a timer serves, and a stopped operator would then
  block deletions.)
- idle scale-down (`fleetgate.operator.idle`): every reconciled service is tracked; a background task
  started at startup scales idle ones with `spec.scaleToZeroAfterSeconds` to zero;
- InferencePools (`fleetgate.operator.pools`, with `--epp-service`): published after each reconcile pass,
  withdrawn on the service's DELETED event, swept for missed deletions by a background task;
- events of the children (Deployment, Service, PDB, HPA): a deleted child re-reconciles its owner at once
  (it is recreated); a child whose owned fields someone edited does too (the fields are put back, one
  DriftCorrected Event); other Deployment and HPA events refresh the owner's status (readiness within a
  watch event). Watching the children is what makes reconciliation level-based for edits, not only for spec
  changes.
No status is returned from handlers (Kopf would write it under status.<handler>): the reconciler owns status.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Callable
from typing import Any

import kopf

from fleetgate.core.tasks import cancel_and_wait
from fleetgate.engine.kube_names import GROUP, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, VERSION
from fleetgate.operator.adapters import PodAdapterApi
from fleetgate.operator.idle import IdleWatch
from fleetgate.operator.kube import KubeApi
from fleetgate.operator.pools import PoolPublisher
from fleetgate.operator.reconciler import Reconciler, SpecRejected
from fleetgate.operator.settings import Capabilities, OperatorSettings

ANNOTATION_PREFIX = "fleetgate.io"
# Children whose deletion is repaired at once (the timer covers the optional kinds).
WATCHED_CHILDREN = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
)

LoginFn = Callable[..., Any]
_CHILDREN_NOT_APPLIED = "children not applied"


def register(
    *,
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    make_api: Callable[[], KubeApi],
    login: LoginFn | None = None,
    detect_capabilities: bool = True,
    identity: str | None = None,
    make_adapter_api: Callable[[], PodAdapterApi] | None = None,
) -> None:
    """`identity`: this operator's Kopf peering identity (as passed to `kopf.run`); with it, the idle
    scale-down task pauses whenever a peer outranks this operator, as Kopf's own handlers do.
    `make_adapter_api`: the engine pods' runtime LoRA API (tests fake it); vLLM's HTTP API by default."""
    kopf.on.login(registry=registry)(login or kopf.login_with_service_account)
    if login is None:
        kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)

    @kopf.on.startup(registry=registry)
    async def _startup(memo: kopf.Memo, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        # The reconciler posts the Events that matter (InvalidSpec, DoesNotFit, ...); Kopf's own would add one
        # per retry while pods start ("failed temporarily"), which is noise in `kubectl describe`.
        settings.posting.enabled = False
        api = make_api()
        if not settings.peering.standalone:
            await _join_peering(api=api, settings=settings, logger=logger)
        effective = operator_settings
        if detect_capabilities:
            caps = Capabilities(
                keda=await api.crd_exists(name="scaledobjects.keda.sh"),
                service_monitor=await api.crd_exists(name="servicemonitors.monitoring.coreos.com"),
            )
            effective = dataclasses.replace(operator_settings, capabilities=caps)
        memo.api = api
        paused = None
        if identity is not None and not settings.peering.standalone:
            paused = functools.partial(
                _outranked, api=api, name=settings.peering.name, priority=settings.peering.priority, identity=identity
            )
        memo.reconciler = Reconciler(
            api=api, settings=effective, adapter_api=make_adapter_api() if make_adapter_api is not None else None,
            paused=paused,
        )  # fmt: skip
        memo.idle = IdleWatch(api=api, interval_s=effective.idle_check_s, paused=paused)
        memo.idle_task = asyncio.create_task(memo.idle.run())
        memo.pools = PoolPublisher(api=api, settings=effective)
        memo.pool_sweep = asyncio.create_task(memo.pools.sweep_forever()) if memo.pools.enabled else None

    operator_settings = settings

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(memo: kopf.Memo, **_: Any) -> None:
        # awaited, not just cancelled: a task still alive when Kopf's root tasks end costs its fixed 5 s grace
        await cancel_and_wait(getattr(memo, "idle_task", None), getattr(memo, "pool_sweep", None))
        reconciler = getattr(memo, "reconciler", None)
        if reconciler is not None:
            await reconciler.aclose()
        api = getattr(memo, "api", None)
        if api is not None:
            await api.aclose()

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def _reconcile(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
        memo.idle.track(body)
        failed = await _reconcile_and_log(memo=memo, body=_plain(body), logger=logger)
        pool = await memo.pools.publish(_plain(body))
        if pool is not None and pool.phase == "Failed":
            failed += (f"{_CHILDREN_NOT_APPLIED}: {pool.message}",)
        if failed:
            raise kopf.TemporaryError(f"not done: {'; '.join(failed)}", delay=settings.retry_failed_s)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def _withdraw_pool(body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any) -> None:
        # No ownerReference on a published InferencePool (GIE's shared ownership): it goes when its service goes.
        if type == "DELETED" and hasattr(memo, "pools"):
            await memo.pools.withdraw(_plain(body))

    for group, version, plural in WATCHED_CHILDREN:

        @kopf.on.event(group, version, plural, labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
        async def _child_event(
            body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, type: str | None = None, **_: Any
        ) -> None:
            meta = body.get("metadata", {})
            owner = (meta.get("labels") or {}).get(LABEL_INSTANCE)
            namespace = meta.get("namespace")
            if not owner or not namespace or not hasattr(memo, "reconciler"):
                return
            api: KubeApi = memo.api
            isvc = await api.get_inference_service(namespace=namespace, name=owner)
            if isvc is None or isvc.get("metadata", {}).get("deletionTimestamp"):
                return  # the owner is gone or going: its children go with it
            if type == "DELETED":
                logger.info(f"{body.get('kind', 'child')} {meta.get('name')} was deleted: reconciling {owner}")
                await _reconcile_and_log(memo=memo, body=isvc, logger=logger)
            else:
                await memo.reconciler.child_changed(isvc, child=_plain(body))


async def _reconcile_and_log(
    *, memo: kopf.Memo, body: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter[Any]
) -> tuple[str, ...]:
    """One reconcile pass, its outcome logged at the level it deserves; returns the children not applied
    (retried by the caller through Kopf). LoRA adapters not loaded are the reconciler's to re-check
    (`fleetgate.operator.resync`): a Kopf retry would log an ERROR every time and hold back spec changes."""
    reconciler: Reconciler = memo.reconciler
    try:
        outcome = await reconciler.reconcile(body)
    except SpecRejected as exc:
        logger.warning(f"invalid spec, nothing changed until it is fixed: {exc}")
        return ()
    if outcome.waiting and not outcome.failed:
        # Model loading takes minutes: Deployment events keep the status current, no retry is needed.
        logger.info(f"waiting for engine pods: {outcome.status['ready']} ready")
    if outcome.adapter_failures:
        logger.warning(f"LoRA adapters not loaded (retried later): {'; '.join(outcome.adapter_failures)}")
    return tuple(f"{_CHILDREN_NOT_APPLIED}: {f}" for f in outcome.failed)


async def _join_peering(
    *, api: KubeApi, settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any]
) -> None:
    """One cluster-wide peering object for every fleetgate operator, created if missing (see the docstring)."""
    name = settings.peering.name
    settings.peering.clusterwide = True
    state, peers = await api.ensure_cluster_peering(name=name)
    blockers = _blocking_peers(peers, priority=settings.peering.priority, now=dt.datetime.now(dt.UTC))
    if blockers:
        # Kopf starts a peered operator paused and logs nothing when it stays paused: say it here.
        logger.warning(
            f"PAUSED: ClusterKopfPeering {name!r} has live operators with priority >= {settings.peering.priority}: "
            f"{', '.join(blockers)}; nothing is reconciled until they stop (or start this one with a higher --priority)"
        )
    if state == "created":
        logger.info(f"created ClusterKopfPeering {name!r}: operators with a higher --priority take over")
    elif state in ("no-crd", "forbidden"):
        why = (
            "the ClusterKopfPeering CRD is not installed (`fleetgate crd --peering | kubectl apply -f -`)"
            if state == "no-crd"
            else f"this identity may not read or create ClusterKopfPeering {name!r}"
        )
        logger.warning(f"running STANDALONE: {why}; a second operator would not be paused (use --standalone to say so)")
        settings.peering.standalone = True
        settings.peering.mandatory = False
    logging.getLogger("kopf._core.engines.peering").addFilter(_loud_pause)


async def _outranked(*, api: KubeApi, name: str, priority: int, identity: str) -> bool:
    """Whether a live peer other than this operator has a priority >= `priority` (Kopf pauses then)."""
    state, peers = await api.ensure_cluster_peering(name=name)
    if state in ("no-crd", "forbidden"):
        return False
    others = {peer: info for peer, info in peers.items() if peer != identity}
    return bool(_blocking_peers(others, priority=priority, now=dt.datetime.now(dt.UTC)))


def _blocking_peers(peers: dict[str, Any], *, priority: int, now: dt.datetime) -> list[str]:
    """Live peers (last seen within their lifetime) whose priority pauses an operator of `priority`."""
    out = []
    for identity, info in peers.items():
        if not isinstance(info, dict):
            continue
        try:
            seen = dt.datetime.fromisoformat(str(info.get("lastseen")))
        except ValueError:
            continue
        seen = seen if seen.tzinfo else seen.replace(tzinfo=dt.UTC)
        alive = seen + dt.timedelta(seconds=int(info.get("lifetime", 60))) > now
        if alive and int(info.get("priority", 0)) >= priority:
            out.append(f"{identity} (priority {info.get('priority', 0)})")
    return out


def _loud_pause(record: logging.LogRecord) -> bool:
    """Kopf announces a pause at INFO; a paused operator reconciles nothing, so it is a WARNING."""
    if record.levelno < logging.WARNING and str(record.msg).startswith("Pausing"):
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = f"{record.msg} Nothing is reconciled until they stop (higher --priority wins)."
    return True


def _plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))
