"""The overhead phase's `reference` background: issue 24's scale as closed-loop chains of unique ~1k-token prompts
with 128-token answers, S streams per engine; its plan, CLI options, progress line and report labels."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest

from fleetgate.bench.live_cli import add_live_arguments, options_from_args
from fleetgate.bench.live_client import LiveRequest, LiveResult
from fleetgate.bench.live_overhead import background_label, chains_ran_out, overhead_line
from fleetgate.bench.live_report import markdown, targets
from fleetgate.bench.live_routing import LiveOptions, estimate_s, plan
from fleetgate.bench.live_workloads import REFERENCE_STAGGER_S, Target, reference_chains
from fleetgate.core.errors import ConfigError

DOOR = Target(url="http://gw-0", model="m", keys={"t0": "k0", "t1": "k1", "t2": "k2"},
              door_urls=("http://gw-0", "http://gw-1"))


def chains(streams: int = 6, window_s: float = 2.0) -> list[LiveRequest]:
    return reference_chains(streams=streams, window_s=window_s, target=DOOR, tenants=["t0", "t1", "t2"],
                            chars_per_token=4.0, seed=7)


def test_reference_requests_are_closed_loop_chains_that_outlast_the_window_with_staggered_starts() -> None:
    reqs = chains(streams=6, window_s=2.0)
    firsts = [r for r in reqs if r.after is None]
    assert len(firsts) == 6  # one chain per stream
    assert [r.at_s for r in firsts] == pytest.approx([c / 6 * REFERENCE_STAGGER_S for c in range(6)])
    by_id = {r.id: r for r in reqs}
    for first in firsts:  # walk each chain: every follower leaves as soon as its predecessor ends
        length, current = 1, first
        while (nxt := next((r for r in reqs if r.after == current.id), None)) is not None:
            assert nxt.at_s == 0.0 and nxt.group == first.group
            length, current = length + 1, nxt
        assert length == math.ceil(2.0 / 0.5) + 2
    assert all(r.after is None or r.after in by_id for r in reqs)
    assert len(reqs) == 6 * (math.ceil(2.0 / 0.5) + 2)


def test_reference_prompts_are_unique_from_their_first_characters_and_ask_exactly_128_tokens() -> None:
    reqs = chains()
    bodies = [json.loads(r.body) for r in reqs]
    prompts = [b["prompt"] for b in bodies]
    assert len({p[:12] for p in prompts}) == len(prompts)  # no two share even a first block's worth of text
    assert all(3900 <= len(p) <= 4020 for p in prompts)  # ~1,000 tokens at 4 characters per token
    assert {(b["max_tokens"], b["ignore_eos"], b["stream"], b["model"]) for b in bodies} == {(128, True, True, "m")}


def test_reference_requests_take_tenants_and_door_replicas_in_turn() -> None:
    reqs = chains(streams=6)
    order = sorted(reqs, key=lambda r: (int(r.id.split("-")[2]), int(r.id.split("-")[1])))  # round, then chain
    assert [r.tenant for r in order[:7]] == ["t0", "t1", "t2", "t0", "t1", "t2", "t0"]
    assert [r.url for r in order[:3]] == ["http://gw-0", "http://gw-1", "http://gw-0"]
    assert all(r.headers["Authorization"] == f"Bearer k{r.tenant[1]}" for r in reqs)
    assert {r.url for r in reqs} == set(DOOR.door_urls)


def test_no_stream_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one stream"):
        chains(streams=0)


def test_a_chain_whose_last_request_was_sent_ran_out() -> None:
    reqs = chains(streams=2, window_s=0.1)  # 3 requests per chain
    sent = [LiveResult(id=r.id, path="gateway", tenant=r.tenant, group=r.group, sent_s=0.0) for r in reqs
            if r.group == "ref-0" or r.id == "ref-1-0"]
    assert chains_ran_out(reqs, sent) == 1
    assert chains_ran_out([], []) == 0


def overhead_specs(**kw: Any) -> list[Any]:
    return [s for s in plan(LiveOptions(loads=[], unique_loads=[], chat_loads=[], **kw), 10.0) if s.tag == "overhead"]


def test_the_plan_runs_the_overhead_phase_on_the_chosen_background() -> None:
    (default,) = overhead_specs()
    assert (default.workload, default.streams, default.rate) == ("shared-prefix", 0, 10.0)
    (ref,) = overhead_specs(overhead_background="reference")
    assert (ref.workload, ref.streams) == ("reference", 64)
    assert ref.name == "reference 64 streams/engine default [overhead]"
    specs = overhead_specs(overhead_background="reference", overhead_streams=8, overhead_replicas=(1, 2))
    assert [(s.streams, s.replicas) for s in specs] == [(8, 1), (8, 2)] and len({s.seed for s in specs}) == 1
    # a closed loop's tail (the requests in flight when the window ends) is budgeted, not a backlog of load - 1
    assert estimate_s(ref) > estimate_s(default) and estimate_s(ref) <= ref.window_s + 8.0 + 5.0


@pytest.mark.parametrize(("kw", "match"), [({"overhead_background": "chat"}, "overhead background 'chat'"),
                                           ({"overhead_background": "reference", "overhead_streams": 0},
                                            "at least one stream")])
def test_the_plan_refuses_an_unknown_background_or_no_streams(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        overhead_specs(**kw)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_live_arguments(p)
    p.add_argument("--prefix-tokens", type=int, default=None)  # added by the commands that embed these options
    p.add_argument("--kv-tokens", type=int, default=None)
    return p


def test_the_cli_chooses_the_background_and_its_streams() -> None:
    base = options_from_args(parser().parse_args([]))
    assert (base.overhead_background, base.overhead_streams) == ("shared-prefix", 64)
    ref = options_from_args(parser().parse_args(["--overhead-background", "reference", "--overhead-streams", "4"]))
    assert (ref.overhead_background, ref.overhead_streams) == ("reference", 4)


@pytest.mark.parametrize("argv", [["--overhead-streams", "0"], ["--overhead-background", "chat"]])
def test_the_cli_refuses_no_streams_and_an_unknown_background(argv: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert "--overhead-" in capsys.readouterr().err


def overhead_row(**extra: Any) -> dict[str, Any]:
    row = {"kind": "overhead", "profile": "default", "gateway_replicas": 1, "idle_added_ms": [1.0, 0.5, 1.5],
           "idle_added_median_ms": [1.0, 0.5, 1.5], "idle_pairs": 40, "loaded_added_ms": [2.0, 1.0, 3.0],
           "loaded_added_median_ms": [2.0, 1.0, 3.0], "loaded_added_p90_ms": 4.0, "loaded_pairs": 200,
           "added_share_of_ttft_p50": 0.002, "background_ttft_p50_s": 1.0, "background_ttft_p90_s": 1.5,
           "background_requests": 900, "output_tps": 6000.0, "gateway_cpu_ms_per_request": 2.0,
           "gateway_cpu_ms_per_1k_output_tokens": 1.0, "client_loop_lag_p99_s": 0.001}
    row.update(extra)
    return row


def test_the_progress_line_and_the_report_name_each_rows_background() -> None:
    ref = overhead_row(background="reference", streams=128, background_prompt_tokens_mean=1004.0,
                       background_chains_ran_out=3)
    old = overhead_row()  # a row written before there was a choice: it was the shared-prefix background
    assert "reference background, 128 closed-loop streams" in overhead_line(ref)
    assert "shared-prefix background at the base rate" in overhead_line(old)
    names = [name for name, _, _ in targets([old, ref]) if name.startswith("gateway overhead")]
    assert len(names) == 2 and "shared-prefix background" in names[0] and "reference background, 128" in names[1]
    text = markdown([old, ref], info={})
    assert "## Gateway at engine speed (default; reference background, 128 closed-loop streams)" in text
    assert "## Gateway at engine speed (default; shared-prefix background at the base rate)" in text
    assert "1,004 prompt tokens on average and 128 output tokens" in text
    assert "3 streams ran out of requests before the window ended" in text
    assert background_label({"background": "shared-prefix"}) == background_label({})
