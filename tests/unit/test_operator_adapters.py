"""One runtime adapter pass over faked engine pods: what is loaded, unloaded and reported, and the status it makes."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetgate.core.adapters import LoadedAdapter
from fleetgate.engine.lora_api import AdapterApiError
from fleetgate.operator.adapters import EnginePod, PodAdapters, new_failures, ready_pods, sync_adapters, sync_pod
from fleetgate.operator.builders import Owner
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import ResolvedAdapter, resolve
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status

POD = EnginePod(name="p", url="http://10.0.0.1:8000")
SQL = ResolvedAdapter(name="sql", path="/a/sql")
LEGAL = ResolvedAdapter(name="legal", path="org/legal")


class Engine:
    """One engine's runtime LoRA API: its adapters as (name -> (base, source)), and the calls made."""

    def __init__(self, held: dict[str, tuple[str, str]] | None = None, *, refuse: str = "", fail_unload: bool = False):
        self.held = dict(held or {})
        self.calls: list[tuple[str, str]] = []
        self.refuse = refuse
        self.fail_unload = fail_unload

    async def loaded(self, *, base_url: str) -> list[LoadedAdapter]:
        return [LoadedAdapter(name=n, base=b, source=s) for n, (b, s) in self.held.items()]

    async def load(self, *, base_url: str, name: str, source: str) -> None:
        self.calls.append(("load", name))
        if name == self.refuse:
            raise AdapterApiError("HTTP 400: bad adapter", status=400)
        self.held[name] = ("base", source)

    async def unload(self, *, base_url: str, name: str) -> None:
        self.calls.append(("unload", name))
        if self.fail_unload:
            raise AdapterApiError("HTTP 500: stuck", status=500)
        self.held.pop(name)

    async def aclose(self) -> None:
        return None


async def test_loads_the_missing_and_unloads_the_removed() -> None:
    engine = Engine({"sql": ("base", "/a/sql"), "old": ("base", "/a/old")})
    result = await sync_pod(api=engine, pod=POD, desired=[SQL, LEGAL], served_model="base")
    assert sorted(engine.calls) == [("load", "legal"), ("unload", "old")]
    assert result == PodAdapters(pod="p", loaded=("legal", "sql"))


async def test_a_changed_source_is_unloaded_and_loaded_again() -> None:
    engine = Engine({"sql": ("base", "/a/sql-v1")})
    result = await sync_pod(api=engine, pod=POD, desired=[SQL], served_model="base")
    assert engine.calls == [("unload", "sql"), ("load", "sql")] and engine.held["sql"] == ("base", "/a/sql")
    assert result.loaded == ("sql",)


async def test_adapters_of_another_base_are_left_alone() -> None:
    engine = Engine({"theirs": ("other-model", "/x")})
    await sync_pod(api=engine, pod=POD, desired=[], served_model="base")
    assert engine.calls == []


async def test_failures_are_reported_per_adapter() -> None:
    engine = Engine({"old": ("base", "/a/old")}, refuse="legal", fail_unload=True)
    result = await sync_pod(api=engine, pod=POD, desired=[SQL, LEGAL], served_model="base")
    assert result.loaded == ("old", "sql")  # the stuck one is still there, and says so
    assert dict(result.failed) == {"legal": "HTTP 400: bad adapter", "old": "unload failed: HTTP 500: stuck"}


async def test_an_engine_that_does_not_answer_fails_every_adapter() -> None:
    class Down(Engine):
        async def loaded(self, *, base_url: str) -> list[LoadedAdapter]:
            raise AdapterApiError("TimeoutError calling http://10.0.0.1:8000/v1/models")

    engine = Down()
    [result] = await sync_adapters(api=engine, pods=[POD], desired=[SQL, LEGAL], served_model="base")
    assert [name for name, _ in result.failed] == ["sql", "legal"] and engine.calls == []
    assert result.failed[0][1].startswith("engine API: TimeoutError")


def test_only_ready_pods_with_an_ip_are_synced() -> None:
    def pod(name: str, ready: str, ip: str | None, deleting: bool = False) -> dict[str, object]:
        meta: dict[str, object] = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
        status: dict[str, object] = {
            "conditions": [{"type": "Ready", "status": ready}],
            **({"podIP": ip} if ip else {}),
        }
        return {"metadata": meta, "status": status}

    pods = [pod("b", "True", "10.0.0.2"), pod("a", "True", "fd00::1"), pod("c", "False", "10.0.0.3"),
            pod("d", "True", None), pod("e", "True", "10.0.0.5", deleting=True)]  # fmt: skip
    assert ready_pods(pods=pods) == [
        EnginePod(name="a", url="http://[fd00::1]:8000"), EnginePod(name="b", url="http://10.0.0.2:8000")
    ]  # fmt: skip


def test_only_new_failures_are_announced() -> None:
    results = [PodAdapters(pod="p", loaded=(), failed=(("sql", "HTTP 400: x"), ("legal", "HTTP 500: y")))]
    previous = {"adapters": [{"pod": "p", "loaded": [], "failed": [{"name": "sql", "reason": "HTTP 400: x"}]}]}
    assert new_failures(results=results, previous=previous) == ["p: legal: HTTP 500: y"]
    assert len(new_failures(results=results, previous=None)) == 2


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        (None, ("Unknown", "NoReadyPods")),
        ([PodAdapters(pod="p", loaded=("sql",))], ("True", "Loaded")),
        ([PodAdapters(pod="p", loaded=(), failed=(("sql", "HTTP 400: x"),))], ("False", "LoadFailed")),
    ],
)
def test_status_lists_adapters_per_pod_with_a_condition(
    results: list[PodAdapters] | None, expected: tuple[str, str]
) -> None:
    spec = parse_spec(
        {"model": {"source": "hf://Qwen/Qwen2.5-7B-Instruct-AWQ"}, "engine": {"quantization": "awq"},
         "resources": {"accelerator": "nvidia-l4"}, "adapters": [{"name": "sql", "source": "/a/sql"}]}
    )  # fmt: skip
    status = compute_status(
        owner=Owner(name="q", namespace="default", uid="u"), spec=spec,
        resolved=resolve(spec=spec, name="q", profiles=Profiles()), invalid=None, deployment=None, previous=None,
        now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), adapters=results,
    )  # fmt: skip
    condition = next(c for c in status["conditions"] if c["type"] == "AdaptersReady")
    assert (condition["status"], condition["reason"]) == expected
    assert status["adapters"] == ([r.to_status() for r in results] if results is not None else None)
    if expected[1] == "LoadFailed":
        assert condition["message"] == "p: sql: HTTP 400: x"
    assert status["capacityPlan"]["maxAdapters"] == 1 and status["capacityPlan"]["maxLoraRank"] == 16
