"""`--gateway-replicas N` in the live bench: requests spread over a door's replicas, the door's CPU summed over its
processes, the charges read through one replica only where the ledger is shared, the probes' turns, and a run that
needs a redis-server and has none failing at its start with what to do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fleetgate.bench.live_cli import add_live_arguments, options_from_args
from fleetgate.bench.live_gateway import GatewayProcess, Profile
from fleetgate.bench.live_overhead import Prober, by_replica
from fleetgate.bench.live_points import LiveContext, charged_delta
from fleetgate.bench.live_replicas import REDIS_ENV, GatewayGroup, require_redis, start_gateways
from fleetgate.bench.live_routing import LiveOptions, run_live
from fleetgate.bench.live_workloads import Sizes, Target, sized_items, to_requests
from fleetgate.core.errors import ConfigError


def test_requests_go_to_the_doors_replicas_in_turn() -> None:
    items = sized_items("shared-prefix", seed=3, rate=20.0, window_s=3.0, sizes=Sizes(prefix_tokens=64),
                        chars_per_token=4.0, capacity_tokens=4096, replicas=2)
    doors = ("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
    reqs = to_requests(items, target=Target(url=doors[0], model="m", keys={"t0": "k"}, door_urls=doors), tenants=1)
    assert [r.url for r in reqs] == [doors[i % 3] for i in range(len(reqs))]
    counts = Counter(r.url for r in reqs)
    assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == 3
    # one replica (no door_urls): every request to the gateway, as before the option
    alone = to_requests(items, target=Target(url=doors[0], model="m", keys={"t0": "k"}), tenants=1)
    assert {r.url for r in alone} == {doors[0]}
    # direct requests still go to the engines in turn, whatever the door
    direct = Target(url="", model="m", keys={}, engine_urls=("http://e0", "http://e1"), door_urls=doors)
    assert [direct.url_of(i) for i in range(3)] == ["http://e0", "http://e1", "http://e0"]


def _busy(seconds: float) -> subprocess.Popen[bytes]:
    code = f"import time\nt=time.process_time()\nwhile time.process_time()-t<{seconds}: pass\ntime.sleep(30)"
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_cpu(proc: GatewayProcess, at_least: float) -> None:
    deadline = time.monotonic() + 20
    while proc.cpu_s() < at_least and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_doors_cpu_is_the_sum_over_its_processes(tmp_path: Path) -> None:
    procs = [GatewayProcess(profile="p", popen=_busy(s), url=f"http://127.0.0.1:{i}", metrics_url="", log_path=tmp_path)
             for i, s in enumerate((0.3, 0.6))]
    group = GatewayGroup(profile="p", replicas=procs)
    try:
        for proc, spent in zip(procs, (0.3, 0.6), strict=True):
            _wait_cpu(proc, spent)
        each = group.cpu_each()
        assert each[0] >= 0.29 and each[1] >= 0.59  # each process's own time, in order
        assert group.cpu_s() == pytest.approx(sum(each), abs=0.05) and group.cpu_s() >= 0.88
        assert group.urls == ("http://127.0.0.1:0", "http://127.0.0.1:1") and group.url == "http://127.0.0.1:0"
        assert group.redis_cpu_s() is None  # no Redis in this door
    finally:
        group.stop()
    assert all(p.popen.poll() is not None for p in procs)  # stop ends every replica


def test_charges_are_read_once_when_the_ledger_is_shared_and_summed_when_not() -> None:
    zero = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0}
    shared = {"requests": 10, "prompt_tokens": 1000, "completion_tokens": 80, "errors": 0}
    assert charged_delta([zero, zero], [shared, shared]) == (shared, True)
    mine = {"requests": 4, "prompt_tokens": 400, "completion_tokens": 32, "errors": 0}
    theirs = {"requests": 6, "prompt_tokens": 600, "completion_tokens": 48, "errors": 1}
    assert charged_delta([zero, zero], [mine, theirs]) == ({"requests": 10, "prompt_tokens": 1000,
                                                            "completion_tokens": 80, "errors": 1}, False)
    # one replica: its own change, as before the option
    assert charged_delta([mine], [shared]) == ({"requests": 6, "prompt_tokens": 600, "completion_tokens": 48,
                                                "errors": 0}, True)


def test_probes_take_the_replicas_in_turn_with_both_orders_on_every_engine() -> None:
    ctx = LiveContext(session=None, urls=["http://e0", "http://e1"], model="m",  # type: ignore[arg-type]
                      keys=None, sizes=Sizes(), chars_per_token=4.0, capacity_tokens=4096,  # type: ignore[arg-type]
                      workdir=Path("."), profiles={})
    prober = Prober(ctx, "http://g0", replicas=("http://g0", "http://g1"))
    # pairs(): gateway pair j goes to engine j % 2 with the gateway's request first when (j // 2) % 2 == 0
    seen = Counter((prober.replica_of(j), j % 2, (j // 2) % 2) for j in range(16))
    assert set(seen) == {(r, e, o) for r in (0, 1) for e in (0, 1) for o in (0, 1)}
    assert set(seen.values()) == {2}  # every replica x engine x order equally often
    assert Prober(ctx, "http://g0").replicas == ("http://g0",)
    assert by_replica([0.001, 0.003, 0.002], [0, 0, 1], 2) == [{"replica": 0, "pairs": 2, "added_ms": 2.0},
                                                              {"replica": 1, "pairs": 1, "added_ms": 2.0}]


def _no_redis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    monkeypatch.delenv(REDIS_ENV, raising=False)


def test_several_replicas_without_a_redis_server_fail_with_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    _no_redis(monkeypatch, tmp_path)
    assert require_redis(1) is None  # one replica: in memory, no Redis wanted
    with pytest.raises(ConfigError, match=r"--gateway-replicas 2: .*no redis-server.*redis_site\.sh"):
        require_redis(2)
    with pytest.raises(ConfigError, match="--gateway-redis"):
        require_redis(1, redis=True)
    with pytest.raises(ConfigError, match="at least 1"):
        require_redis(0)
    monkeypatch.setenv(REDIS_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not an executable"):
        require_redis(2)
    fake = tmp_path / "redis-wrapper"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(REDIS_ENV, str(fake))
    assert require_redis(3) == str(fake)  # $FLEETGATE_REDIS_SERVER wins over PATH
    with pytest.raises(ConfigError, match="no redis-server given"):
        start_gateways(Profile(name="p", routing=None), replicas=2, redis_binary=None, model="m", urls=[],
                       keys=None, workdir=tmp_path)  # type: ignore[arg-type]


def test_a_live_run_of_several_replicas_stops_at_its_start_without_redis(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    _no_redis(monkeypatch, tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no redis-server"):  # before it asks any engine anything (port 9: none)
        asyncio.run(run_live(["http://127.0.0.1:9"], LiveOptions(gateway_replicas=2), out_dir=tmp_path,
                             workdir=tmp_path, log=lambda _: None))
    assert time.monotonic() - started < 5 and not (tmp_path / "results.jsonl").exists()  # no row: nothing ran


def test_the_cli_options_default_to_one_in_memory_gateway() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_live_arguments(parser)
    parser.add_argument("--prefix-tokens", type=int, default=None)
    parser.add_argument("--kv-tokens", type=int, default=None)
    base = options_from_args(parser.parse_args([]))
    assert (base.gateway_replicas, base.gateway_redis) == (1, False)
    two = options_from_args(parser.parse_args(["--gateway-replicas", "2", "--gateway-redis"]))
    assert (two.gateway_replicas, two.gateway_redis) == (2, True)
