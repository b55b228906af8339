"""Simulating a live run's prompts at its own characters per token (issue 24, "vllm-v1-livetext").

The live gateway's prefix scorer converts an engine's scraped KV capacity (tokens) into the characters its
index may remember with `charsPerToken` 4, while Llama 3.1 tokenises the benchmark's text at 6.48 characters per
token: the index forgets prefixes that the engine still holds, and the default profile then moves those prompts
by load. Simulating at 4 characters per token hid that (the simulated index was exactly right), which is why the
'vllm-v1' model's default profile hit ~10 points more than the live one on the H200 runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from fleetgate.router.hashing import chained_block_hashes
from fleetgate.router.prefix_index import PrefixIndex
from fleetgate.sim.engine import SimEngine, count_tokens
from fleetgate.sim.fit import Setup, setup_from
from fleetgate.sim.fit_split import MODELS, start_profile
from fleetgate.sim.profile import SimProfile
from fleetgate.sim.workloads import Sizes

BLOCK_CHARS = 512  # the prefix scorer's default blockChars
GATEWAY_CHARS_PER_TOKEN = 4  # the prefix scorer's default charsPerToken


def group_prompt(group: int, tokens: int, chars_per_token: float) -> str:
    return f"group {group:02d} " + "lorem ipsum " * int(tokens * chars_per_token / 12)


def held_by_engine_and_index(chars_per_token: float) -> tuple[int, int, int, int]:
    """Five 800-token prompts of different prefixes, one after the other, through one simulated engine of 4,096
    tokens, each recorded in the gateway's index as `PrefixAffinityScorer.on_start` does. Returns the first
    prompt's full KV blocks, those the engine still has cached, its full router blocks, and those the index
    still matches."""
    profile = SimProfile(block_size=16, chars_per_token=chars_per_token, num_blocks=256, max_num_seqs=8,
                         max_batched_tokens=4096, scheduler="vllm-v1")
    engine = SimEngine(profile=profile)
    index = PrefixIndex(default_capacity_blocks=1)
    index.set_capacity("e", profile.capacity_tokens * GATEWAY_CHARS_PER_TOKEN // BLOCK_CHARS)
    prompts = [group_prompt(g, 800, chars_per_token) for g in range(5)]
    for i, prompt in enumerate(prompts):
        engine.add(engine.make_request(request_id=str(i), prompt=prompt, max_tokens=1, now=0.0))
        index.record("e", chained_block_hashes(prompt, block_chars=BLOCK_CHARS))
        while (step := engine.plan_step()) is not None:
            engine.finish_step(step, now=0.0)
    first = engine.make_request(request_id="again", prompt=prompts[0], max_tokens=1, now=0.0)
    router_hashes = chained_block_hashes(prompts[0], block_chars=BLOCK_CHARS)
    return (len(first.block_hashes), engine.kv.match(first.block_hashes), len(router_hashes),
            index.match("e", router_hashes))


def test_fractional_chars_per_token_tokenises_like_the_live_engine() -> None:
    text = group_prompt(0, 800, 6.48)
    assert count_tokens(text, chars_per_token=6.48) == pytest.approx(800, abs=2)
    engine = SimEngine(profile=SimProfile(chars_per_token=6.48, scheduler="vllm-v1", num_blocks=256))
    req = engine.make_request(request_id="a", prompt=text, max_tokens=1, now=0.0)
    # KV blocks of round(16 x 6.48) = 104 characters: 16 tokens of this text each, within one block
    assert req.prompt_tokens // 16 - 1 <= len(req.block_hashes) <= req.prompt_tokens // 16


def test_at_4_chars_per_token_the_gateway_index_agrees_with_the_engine() -> None:
    blocks, cached, router_blocks, index_blocks = held_by_engine_and_index(4.0)
    assert cached == blocks == 50  # 4,000 of 4,096 tokens: every prompt is still cached
    assert index_blocks == router_blocks  # and the index believes it


def test_at_the_live_chars_per_token_the_index_forgets_what_the_engine_holds() -> None:
    blocks, cached, router_blocks, index_blocks = held_by_engine_and_index(6.48)
    assert cached == blocks >= 49  # the engine holds the first prompt as before (its KV counts tokens)
    assert router_blocks > 0 and index_blocks == 0  # the index, sized at 4 chars per token, has dropped it


def test_the_livetext_model_simulates_at_the_runs_measured_ratio(tmp_path: Path) -> None:
    sizes = asdict(Sizes(prefix_tokens=256, question_tokens=32, output_tokens=16, tenants=4))
    meta = {"kind": "meta", "replicas": 2, "kv_capacity_tokens": 4096, "sizes": sizes, "chars_per_token": 6.48}
    setup = setup_from([meta], max_num_seqs=16, max_batched_tokens=2048)
    assert setup.chars_per_token == 6.48
    assert start_profile([], setup, card="h200", scheduler="vllm-v1-livetext").chars_per_token == 6.48
    # the earlier models are unchanged: 4 characters per token, whatever the run measured
    assert start_profile([], setup, card="h200", scheduler="vllm-v1").chars_per_token == 4
    assert start_profile([], setup, card="h200", scheduler="reserve").chars_per_token == 4
    assert MODELS["vllm-v1-livetext"].constants == MODELS["vllm-v1"].constants
    assert Setup(replicas=1, capacity_tokens=1, max_num_seqs=1, max_batched_tokens=1, sizes={}).chars_per_token == 4
    assert json.dumps(asdict(setup))  # still a plain record (saved in results)
