"""Calibrating the simulator per card on several runs, tuned on some files and judged on others.

Synthetic runs: the simulator itself ("vllm-v1", known constants) produces the figures of every point; the
training file carries a calibration probe whose step overhead is twice the truth. The fit must recover the
truth closely enough to predict the held-out file's points, and the profile-order check must count pairs.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleetgate.sim.fit import Observation, Setup, main, simulate
from fleetgate.sim.fit_split import calibrate, load_split, ordering, start_profile
from fleetgate.sim.workloads import Sizes

SIZES = Sizes(prefix_tokens=256, question_tokens=32, output_tokens=16, tenants=4)
SETUP = Setup(replicas=2, capacity_tokens=4096, max_num_seqs=16, max_batched_tokens=2048, sizes=asdict(SIZES))
TRUTH = {"step_overhead_s": 0.02, "prefill_s_per_token": 0.0004, "decode_s_per_seq": 0.002,
         "decode_s_per_ctx_token": 2e-6, "request_overhead_s": 0.01}


def write_run(path: Path, points: list[tuple[str, str, float, int]], *, probe: bool) -> None:
    truth = start_profile([], SETUP, card="h100", scheduler="vllm-v1").with_(**TRUTH)
    rows: list[dict[str, Any]] = [{"kind": "meta", "replicas": SETUP.replicas,
                                   "kv_capacity_tokens": SETUP.capacity_tokens, "sizes": SETUP.sizes}]
    if probe:
        rows.append({"kind": "calibration", "step_overhead_s": 0.04, "prefill_s_per_token": 0.0004,
                     "decode_s_per_seq": 0.002})
    for workload, profile, load, seed in points:
        obs = Observation(workload=workload, profile=profile, load=load, rate=12.0 * load, window_s=6.0, seed=seed,
                          users=0, ttft_p50_s=1, ttft_p90_s=1, output_tps=1, hit_rate=0)
        sim = asyncio.run(simulate(obs, truth, SETUP))
        rows.append({"kind": "point", "tag": "routing" if seed == 11 else f"seed-{seed}", "workload": workload,
                     "profile": profile, "load": load, "rate": obs.rate, "window_s": obs.window_s, "seed": seed,
                     "users": 0, **sim})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path.parent / f"{path.stem}-run-info.json").write_text(json.dumps({"max_num_seqs": SETUP.max_num_seqs,
                                                                         "max_num_batched_tokens": 2048}))


def test_per_card_fit_on_training_files_predicts_the_held_out_file(tmp_path: Path) -> None:
    shared = "shared-prefix"
    write_run(tmp_path / "train.jsonl", [(shared, "round-robin", 1.0, 11), (shared, "default", 2.0, 11),
                                         ("unique", "round-robin", 0.5, 11)], probe=True)
    write_run(tmp_path / "test.jsonl", [(shared, "round-robin", 2.0, 11), (shared, "default", 2.0, 11),
                                        (shared, "least-loaded", 2.0, 11), (shared, "round-robin", 2.0, 13)],
              probe=False)
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"cards": {"h100": {"train": ["train.jsonl"], "test": ["test.jsonl"]}}}))
    cards = load_split(split, root=tmp_path)
    result = asyncio.run(calibrate(cards, schedulers=["vllm-v1"], passes=1, progress=lambda _: None))
    model = result["cards"]["h100"]["models"]["vllm-v1"]
    assert result["cards"]["h100"]["n_train"] == 3 and result["cards"]["h100"]["n_test"] == 4  # seed-13 included
    assert model["start"]["step_overhead_s"] == 0.04  # from the training file's probe
    assert abs(model["fitted"]["step_overhead_s"] - 0.02) < abs(0.04 - 0.02)  # moved towards the truth
    test = model["test"]["summary"]
    assert test["ttft_p50_s"] < 0.15 and test["output_tps"] < 0.05, test
    assert model["order"]["ttft_p50_s"]["points"] == 1  # one point (file, workload, load, seed 11) has 3 profiles


def test_the_cli_takes_a_split_and_writes_the_report(tmp_path: Path, monkeypatch: Any) -> None:
    write_run(tmp_path / "a.jsonl", [("unique", "round-robin", 0.5, 11)], probe=True)
    write_run(tmp_path / "b.jsonl", [("unique", "default", 0.5, 11)], probe=False)
    (tmp_path / "split.json").write_text(json.dumps({"cards": {"h200": {"train": ["a.jsonl"], "test": ["b.jsonl"]}}}))
    monkeypatch.chdir(tmp_path)
    assert main(["--split", "split.json", "--scheduler", "reserve,vllm-v1", "--passes", "1", "--out", "r.md"]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| h200 | reserve | test | 1 |" in text and "| h200 | vllm-v1 | train | 1 |" in text
    assert json.loads((tmp_path / "r.json").read_text())["schedulers"] == ["reserve", "vllm-v1"]
    # a saved result re-renders to the same report without simulating again
    assert main(["--split", "split.json", "--rescore", "r.json", "--out", "again.md"]) == 0
    assert (tmp_path / "again.md").read_text() == text


def row(group: str, p50_measured: float, p50_simulated: float) -> dict[str, Any]:
    return {"group": group, "ttft_p50_s": {"measured": p50_measured, "simulated": p50_simulated}}


def test_ordering_counts_pairs_and_leaves_near_ties_out() -> None:
    rows = [row("x", 1.0, 0.5), row("x", 2.0, 0.9), row("x", 1.05, 3.0),  # (1.0, 1.05) is a tie
            row("y", 1.0, 1.0), row("y", 3.0, 0.2), row("z", 5.0, 5.0)]  # z: one profile, no pair
    out = ordering(rows, figure="ttft_p50_s")
    # x: (1.0, 2.0) right; (2.0, 1.05) wrong; y: (1.0, 3.0) wrong
    assert out == {"pairs": 3, "right": 1, "ties": 1, "points": 2, "points_all_right": 0}
