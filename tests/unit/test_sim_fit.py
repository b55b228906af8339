"""Fitting the simulator's step-time constants on some live points and judging them on the others.

Synthetic "measurements": the simulator itself under known constants produces the figures of every point
(round-robin up to 4x its capacity, so the training set holds saturated points); the fit starts from a
calibration whose step overhead is twice the truth, trains on the round-robin shared-prefix points only,
and must land near the truth and predict the held-out points (other profiles, unique prompts) better than
the starting constants did.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

import pytest

from fleetgate.sim.fit import (
    Observation,
    Setup,
    base_profile,
    markdown,
    observations,
    run_fit,
    runnable,
    simulate,
    split,
)
from fleetgate.sim.profile import PROFILES
from fleetgate.sim.workloads import Sizes

SIZES = Sizes(prefix_tokens=256, question_tokens=32, output_tokens=16, tenants=4)
SETUP = Setup(replicas=2, capacity_tokens=4096, max_num_seqs=16, max_batched_tokens=2048, sizes=asdict(SIZES))
TRUTH = {"step_overhead_s": 0.02, "prefill_s_per_token": 0.0004, "decode_s_per_seq": 0.002}
RATE = 12.0
POINTS = [("shared-prefix", "round-robin", 0.5), ("shared-prefix", "round-robin", 2.0),
          ("shared-prefix", "round-robin", 4.0), ("shared-prefix", "default", 2.0),
          ("shared-prefix", "least-loaded", 4.0), ("unique", "least-loaded", 0.5)]


def synthetic_rows() -> list[dict[str, Any]]:
    truth = base_profile([], SETUP, fallback=PROFILES["gpu-8b"].with_(**TRUTH))
    rows: list[dict[str, Any]] = [
        {"kind": "meta", "replicas": SETUP.replicas, "kv_capacity_tokens": SETUP.capacity_tokens,
         "sizes": SETUP.sizes},
        {"kind": "calibration", "step_overhead_s": TRUTH["step_overhead_s"] * 2.0,
         "prefill_s_per_token": TRUTH["prefill_s_per_token"], "decode_s_per_seq": TRUTH["decode_s_per_seq"]},
    ]
    for workload, profile, load in POINTS:
        obs = Observation(workload=workload, profile=profile, load=load, rate=RATE * load, window_s=6.0, seed=11,
                          users=0, ttft_p50_s=1, ttft_p90_s=1, output_tps=1, hit_rate=0)
        sim = asyncio.run(simulate(obs, truth, SETUP))
        rows.append({"kind": "point", "tag": "routing", "workload": workload, "profile": profile, "load": load,
                     "rate": obs.rate, "window_s": obs.window_s, "seed": obs.seed, "users": 0, **sim})
    rows.append({"kind": "point", "tag": "routing", "workload": "shared-prefix", "profile": "precise-prefix",
                 "load": 1.0, "rate": 6.0, "window_s": 6.0, "seed": 11, "users": 0, "ttft_p50_s": 0.5,
                 "ttft_p90_s": 0.9, "output_tps": 100.0, "hit_rate": 0.8})
    return rows


@pytest.fixture(scope="module")
def fitted() -> dict[str, Any]:
    rows = synthetic_rows()
    return asyncio.run(run_fit(rows, train_keys={"shared-prefix:round-robin"}, max_num_seqs=SETUP.max_num_seqs,
                               max_batched_tokens=SETUP.max_batched_tokens, progress=lambda _: None))


def test_the_split_trains_on_round_robin_and_holds_out_the_rest(fitted: dict[str, Any]) -> None:
    assert len(fitted["train"]) == 3 and all("round-robin" in name for name in fitted["train"])
    assert len(fitted["test"]) == 3
    assert fitted["not_simulable"] == ["precise-prefix"]  # the simulated engines publish no KV events


def test_the_fit_lands_near_the_truth(fitted: dict[str, Any]) -> None:
    for name, true in TRUTH.items():
        assert fitted["fitted"][name] == pytest.approx(true, rel=0.1), name
    base = fitted["summary"]["train"]["base"]
    after = fitted["summary"]["train"]["fitted"]
    assert after["ttft_p50_s"] < base["ttft_p50_s"]


def test_held_out_points_are_predicted_better_than_by_the_starting_constants(fitted: dict[str, Any]) -> None:
    base = fitted["summary"]["test"]["base"]
    after = fitted["summary"]["test"]["fitted"]
    for figure in ("ttft_p50_s", "ttft_p90_s", "output_tps"):
        assert after[figure] < base[figure], figure
    assert after["ttft_p50_s"] < 0.05 and base["ttft_p50_s"] > 0.2
    text = markdown(fitted)
    assert "| test | fitted |" in text and "shared-prefix x2 default" in text


def test_observations_take_routing_points_only() -> None:
    rows = [{"kind": "point", "tag": "accounting", "workload": "shared-prefix", "profile": "default",
             "ttft_p50_s": 1.0}, {"kind": "overhead"}]
    assert observations(rows) == []
    assert runnable("round-robin") and runnable("default") and not runnable("precise-prefix")
    train, test = split([], {"x:y"})
    assert train == [] and test == []
