"""Runtime LoRA adapters: make every ready engine pod hold exactly the adapters `spec.adapters` lists.

Adapters are not start-up flags (no `--lora-modules`), so adding or removing one never changes the pod
template and never restarts a pod: the operator loads and unloads them through each pod's vLLM runtime API
(`fleetgate.engine.lora_api`; the pods run with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). One pass, per
ready pod, concurrently across pods:

    loaded  = the LoRAs the pod's `GET /v1/models` lists with parent = the served model
    unload  = loaded - desired, plus any desired adapter loaded from another path (its source changed)
    load    = desired - (loaded - unload)

A pod that does not answer `/v1/models` counts every desired adapter as failed (reason: the error). Passes
are level-based and idempotent (loading a loaded adapter and unloading an absent one are successes), so
they run on every reconcile and every Deployment change (a new or restarted pod is loaded when it turns
ready). The HTTP calls sit behind `PodAdapterApi`, so tests fake the pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fleetgate.core.adapters import LoadedAdapter
from fleetgate.engine import lora_api
from fleetgate.engine.kube_names import ENGINE_PORT
from fleetgate.operator.resolve import ResolvedAdapter

if TYPE_CHECKING:
    import aiohttp

_REASON_MAX = 300


class PodAdapterApi(Protocol):
    """One engine pod's runtime adapter API; raises `lora_api.AdapterApiError` on failure."""

    async def loaded(self, *, base_url: str) -> list[LoadedAdapter]: ...

    async def load(self, *, base_url: str, name: str, source: str) -> None: ...

    async def unload(self, *, base_url: str, name: str) -> None: ...

    async def aclose(self) -> None: ...


class VllmAdapterApi:
    """`PodAdapterApi` over vLLM's HTTP API: one aiohttp session, opened on first use, with deadlines."""

    def __init__(self, *, load_timeout_s: float = 60.0, list_timeout_s: float = 5.0) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._load_timeout_s = load_timeout_s
        self._list_timeout_s = list_timeout_s

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def loaded(self, *, base_url: str) -> list[LoadedAdapter]:
        return await lora_api.loaded_adapters(self._client(), base_url, timeout_s=self._list_timeout_s)

    async def load(self, *, base_url: str, name: str, source: str) -> None:
        await lora_api.load_adapter(self._client(), base_url, name=name, source=source, timeout_s=self._load_timeout_s)

    async def unload(self, *, base_url: str, name: str) -> None:
        await lora_api.unload_adapter(self._client(), base_url, name=name, timeout_s=self._load_timeout_s)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass(frozen=True, kw_only=True)
class EnginePod:
    name: str
    url: str  # http://<pod IP>:<engine port>


@dataclass(frozen=True, kw_only=True)
class PodAdapters:
    """What one pod holds after a pass: loaded adapter names, and (name, reason) of those that failed."""

    pod: str
    loaded: tuple[str, ...]
    failed: tuple[tuple[str, str], ...] = ()

    def to_status(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "loaded": list(self.loaded),
            "failed": [{"name": name, "reason": reason} for name, reason in self.failed],
        }


def ready_pods(*, pods: Sequence[dict[str, Any]]) -> list[EnginePod]:
    """Engine pods that serve: Ready, with an IP, not being deleted (sorted by name, for a stable status)."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        ip = status.get("podIP")
        if ready and ip and not meta.get("deletionTimestamp") and meta.get("name"):
            host = f"[{ip}]" if ":" in ip else ip
            out.append(EnginePod(name=meta["name"], url=f"http://{host}:{ENGINE_PORT}"))
    return sorted(out, key=lambda p: p.name)


def _reason(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:_REASON_MAX]


async def sync_pod(
    *, api: PodAdapterApi, pod: EnginePod, desired: Sequence[ResolvedAdapter], served_model: str
) -> PodAdapters:
    """One pod to the desired adapters (see the module docstring)."""
    try:
        current = [a for a in await api.loaded(base_url=pod.url) if a.base in (None, served_model)]
    except lora_api.AdapterApiError as exc:
        why = f"engine API: {_reason(exc)}"
        return PodAdapters(pod=pod.name, loaded=(), failed=tuple((a.name, why) for a in desired))
    wanted = {a.name: a for a in desired}
    stale = {
        a.name for a in current if a.name not in wanted or (a.source is not None and a.source != wanted[a.name].path)
    }
    present = {a.name for a in current} - stale
    failed: dict[str, str] = {}
    loaded = set(present)

    async def unload(name: str) -> None:
        try:
            await api.unload(base_url=pod.url, name=name)
        except lora_api.AdapterApiError as exc:
            failed[name] = f"unload failed: {_reason(exc)}"
            if name not in wanted:
                loaded.add(name)  # still there: the status says so, the next pass tries again

    await asyncio.gather(*(unload(name) for name in sorted(stale)))

    async def load(adapter: ResolvedAdapter) -> None:
        try:
            await api.load(base_url=pod.url, name=adapter.name, source=adapter.path)
            loaded.add(adapter.name)
        except lora_api.AdapterApiError as exc:
            failed[adapter.name] = _reason(exc)

    await asyncio.gather(*(load(a) for a in desired if a.name not in present and a.name not in failed))
    return PodAdapters(pod=pod.name, loaded=tuple(sorted(loaded)), failed=tuple(sorted(failed.items())))


async def sync_adapters(
    *, api: PodAdapterApi, pods: Sequence[EnginePod], desired: Sequence[ResolvedAdapter], served_model: str
) -> list[PodAdapters]:
    """Every ready pod to the desired adapters, concurrently."""
    return list(
        await asyncio.gather(*(sync_pod(api=api, pod=p, desired=desired, served_model=served_model) for p in pods))
    )


def failures(*, results: Sequence[PodAdapters]) -> list[str]:
    """`pod: adapter: reason` for every failed adapter, in a stable order."""
    return [f"{r.pod}: {name}: {reason}" for r in results for name, reason in r.failed]


def new_failures(*, results: Sequence[PodAdapters], previous: dict[str, Any] | None) -> list[str]:
    """Failures the previous status did not show already (one Event each, not one per pass)."""
    before = {
        (entry.get("pod"), f.get("name"), f.get("reason"))
        for entry in (previous or {}).get("adapters") or []
        if isinstance(entry, dict)
        for f in entry.get("failed") or []
        if isinstance(f, dict)
    }
    return [
        f"{r.pod}: {name}: {reason}"
        for r in results
        for name, reason in r.failed
        if (r.pod, name, reason) not in before
    ]
