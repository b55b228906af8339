"""The local tokenizer's encode in a worker thread (issue 24): the same token ids, hashes and scores as on the event
loop, the loop free meanwhile, short texts kept on the loop, and a failing encode routed approximately."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from fleetgate.core.types import Endpoint
from fleetgate.router import prompt_tokens
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import BlockStored, encode_batch
from fleetgate.router.kv_fleet import KvEventFleet
from fleetgate.router.kv_subscriber import EndpointKvState
from fleetgate.router.plugins.base import CycleState
from fleetgate.router.plugins.precise_prefix_scorer import HASHES, PrecisePrefixScorer
from fleetgate.router.plugins.prefix_scorer import PrefixAffinityScorer
from fleetgate.router.prompt_tokens import LocalTokenizer
from fleetgate.router.segment_tokens import Plan, build_segmented_encoder
from fleetgate.router.types import RoutingRequest

from .test_segment_tokens import CORPUS, GEMMA_PLAIN, GEMMA_SPECIAL, gemma_style, llama3_style

BS = 4
EPS = [Endpoint(id=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", model="m") for i in range(3)]


def _save(backend: Tokenizer, folder: Path, bos: str) -> str:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos)
    hf.chat_template = (Path(__file__).parents[1] / "data/tokenizers/llama3-style-chat-template.jinja").read_text()
    hf.save_pretrained(str(folder))
    return str(folder)


async def _tokenizer(path: str, thread_min_chars: int | None) -> LocalTokenizer:
    tok = LocalTokenizer(paths={"m": path}, cache_entries=1, thread_min_chars=thread_min_chars)
    await tok.warm(30.0)
    assert tok._loaded["m"].segments is not None  # the segment-wise path is the one under test
    return tok


def _requests() -> list[RoutingRequest]:
    """Shared-prefix completions (system + "\\n" + question, as the benchmark sends), chats, added-token text."""
    systems = [" ".join(CORPUS) * k for k in (3, 5, 8)]
    out = []
    for i in range(24):
        system = systems[i % len(systems)]
        body: dict[str, Any]
        if i % 3 == 2:
            body = {"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": f"q{i} <bos>\n\n<|eot_id|> " + CORPUS[i % 4] * (i % 5)}]}
        else:
            body = {"prompt": f"{system}\nQuestion {i}: " + CORPUS[i % 4] * (1 + i % 7)}
        kind = "completions" if "prompt" in body else "chat"
        out.append(RoutingRequest(request_id=str(i), model="m", prompt_text=str(body), kind=kind, body=body))
    return out


def _held(tokens: list[int], n_blocks: int, clock: Any) -> EndpointKvState:
    state = EndpointKvState(blocks=EndpointBlocks(), stale_s=5.0, clock=clock)
    state.connected = state.synced = True
    event = BlockStored(block_hashes=tuple(range(1, n_blocks + 1)), parent_block_hash=None,
                        token_ids=tuple(tokens[: n_blocks * BS]), block_size=BS, medium="GPU", group_idx=0,
                        spec_kind="full_attention")
    state.apply(encode_batch([event]), 0)
    return state


def _scorer(tok: LocalTokenizer, truth: list[int]) -> PrecisePrefixScorer:
    """e0 holds the whole of `truth`'s blocks, e1 a third of them, e2 none."""
    def clock() -> float:
        return 100.0

    state = FleetState(clock=clock)
    fleet = KvEventFleet(stale_s=5.0, clock=clock)
    n = len(truth) // BS
    for ep, held in zip(EPS, (n, n // 3, 0), strict=True):
        if held:
            fleet.states[ep.id] = _held(truth, held, clock)
        else:
            fleet.states[ep.id] = EndpointKvState(blocks=EndpointBlocks(), stale_s=5.0, clock=clock)
            fleet.states[ep.id].connected = fleet.states[ep.id].synced = True
            fleet.states[ep.id].blocks.block_size = BS
    approx = PrefixAffinityScorer(name="prefix.approximate", state=state, block_chars=64, hotspot_margin=None)
    return PrecisePrefixScorer(name="prefix", state=state, fleet=fleet, tokenizer=tok, approx=approx,
                               hotspot_margin=None)


@pytest.mark.parametrize("make,bos", [(gemma_style, GEMMA_SPECIAL[0]), (llama3_style, "<|begin_of_text|>")])
async def test_scores_and_hashes_are_the_same_with_the_encode_in_a_thread_or_on_the_loop(
        tmp_path: Path, make: Any, bos: str) -> None:
    path = _save(make(), tmp_path, bos)
    on_loop = await _tokenizer(path, None)
    threaded = await _tokenizer(path, 0)  # every encode with text to encode goes to the thread
    reqs = _requests()
    full = [prompt_tokens._encode(on_loop._loaded["m"].tok, r.body or {}) for r in reqs]  # no segments: the truth
    scorers = [_scorer(tok, full[0]) for tok in (on_loop, threaded)]
    for _ in range(2):  # the second pass reads the system prompts from the segment caches
        for req, truth in zip(reqs, full, strict=True):
            results = []
            for scorer in scorers:
                cycle: CycleState = {}
                await scorer.produce(req, cycle, EPS)
                results.append((scorer.score(req, cycle, EPS), cycle[HASHES], cycle["precise.tokens"]))
            assert results[0] == results[1]
            assert results[0][2] == truth
            assert results[0][1] == {BS: token_block_hashes(truth, block_size=BS, max_blocks=1024)}
    assert any(s > 0 for s in scorers[0].score(reqs[0], {"precise.tokens": full[0],
                                                          HASHES: {BS: token_block_hashes(full[0], block_size=BS)}},
                                                EPS))  # the prompts did match held blocks somewhere
    assert on_loop.encodes["thread"] == 0 and on_loop.encodes["loop"] > 0
    assert threaded.encodes["loop"] == 0 and threaded.encodes["thread"] > 0
    for tok in (on_loop, threaded):
        await tok.aclose()


async def test_the_encode_runs_in_a_worker_thread_while_the_loop_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(gemma_style(), tmp_path, GEMMA_SPECIAL[0])
    tok = await _tokenizer(path, 512)
    real = prompt_tokens.encode_texts
    loop_ran = threading.Event()
    threads: list[int] = []

    def encode(backend: Any, texts: list[str], special: bool = False) -> list[list[int]]:
        threads.append(threading.get_ident())
        if threading.get_ident() != main:
            assert loop_ran.wait(5), "the event loop did not run while the thread encoded"
        return real(backend, texts, special)

    async def tick() -> None:
        await asyncio.sleep(0)
        loop_ran.set()  # only possible if the loop is not blocked in the encode

    main = threading.get_ident()
    monkeypatch.setattr(prompt_tokens, "encode_texts", encode)
    long = RoutingRequest(request_id="a", model="m", prompt_text="", kind="completions",
                          body={"prompt": " ".join(CORPUS) * 10 + "\nquestion"})
    ticker = asyncio.create_task(tick())
    want = list(tok._loaded["m"].tok.backend_tokenizer.encode(long.body["prompt"]).ids)  # type: ignore[index]
    assert await tok.tokens(long, EPS[:1]) == want
    await ticker
    assert threads and threads[-1] != main and tok.encodes == {"thread": 1, "loop": 0}
    short = RoutingRequest(request_id="b", model="m", prompt_text="", kind="completions",
                           body={"prompt": "a short question" + GEMMA_PLAIN[0] + "x"})
    assert await tok.tokens(short, EPS[:1]) == list(
        tok._loaded["m"].tok.backend_tokenizer.encode(short.body["prompt"]).ids)  # type: ignore[index]
    assert threads[-1] == main and tok.encodes == {"thread": 1, "loop": 1}  # below 512 characters: on the loop
    await tok.aclose()
    assert tok._pool is None


async def test_a_failing_encode_in_the_thread_routes_approximately_and_caches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(gemma_style(), tmp_path, GEMMA_SPECIAL[0])
    tok = await _tokenizer(path, 0)
    segments = tok._loaded["m"].segments
    assert segments is not None

    def broken(backend: Any, texts: list[str], special: bool = False) -> list[list[int]]:
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(prompt_tokens, "encode_texts", broken)
    req = RoutingRequest(request_id="a", model="m", prompt_text="", kind="completions",
                         body={"prompt": " ".join(CORPUS) * 10 + "\nquestion"})
    assert await tok.tokens(req, EPS[:1]) is None
    assert tok.failures == 1 and len(segments.cache) == 0  # nothing half-done was cached
    await tok.aclose()


async def test_a_stuck_encode_costs_a_request_the_timeout_then_routing_is_approximate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of huge prompts (or a tokenizer that hangs) must not hold decisions up: past `tokenizeTimeoutS` the
    request routes on the approximate index, and the loop ran all along."""
    path = _save(gemma_style(), tmp_path, GEMMA_SPECIAL[0])
    tok = LocalTokenizer(paths={"m": path}, cache_entries=1, thread_min_chars=0, timeout_s=0.1)
    await tok.warm(30.0)
    real = prompt_tokens.encode_texts
    release = threading.Event()

    def stuck(backend: Any, texts: list[str], special: bool = False) -> list[list[int]]:
        release.wait(5)
        return real(backend, texts, special)

    monkeypatch.setattr(prompt_tokens, "encode_texts", stuck)
    req = RoutingRequest(request_id="a", model="m", prompt_text="", kind="completions",
                         body={"prompt": " ".join(CORPUS) * 10 + "\nquestion"})
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    running = asyncio.create_task(ticker())
    started = asyncio.get_running_loop().time()
    assert await tok.tokens(req, EPS[:1]) is None
    elapsed = asyncio.get_running_loop().time() - started
    running.cancel()
    assert 0.09 <= elapsed < 1.0 and ticks >= 5 and tok.failures == 1  # the loop kept ticking while it waited
    release.set()
    monkeypatch.setattr(prompt_tokens, "encode_texts", real)
    assert await tok.tokens(req, EPS[:1]) == list(
        tok._loaded["m"].tok.backend_tokenizer.encode(req.body["prompt"]).ids)  # type: ignore[index]
    await tok.aclose()
    with pytest.raises(ValueError, match="tokenizeTimeoutS"):
        LocalTokenizer(paths={"m": path}, timeout_s=0)


def test_a_chunk_repeated_in_one_text_is_encoded_once_and_the_plan_checks_its_inputs() -> None:
    backend = gemma_style()
    encoder = build_segmented_encoder(backend, max_entries=8, max_bytes=1 << 22, min_chars=64)
    assert encoder is not None
    chunk = "the shared policy text, " * 4  # no added token inside: one chunk of 100 characters
    text = f"{chunk}\n{chunk}\n{chunk}\nend"
    plan = encoder.plan(text, add_special_tokens=True)
    assert plan is not None and len(set(plan.texts)) == len(plan.texts)  # each text to encode once
    assert plan.parts.count(plan.texts.index("\n" + chunk)) == 2  # "\n" + chunk twice, in its two places
    encoded = [list(e.ids) for e in backend.encode_batch_fast(plan.texts, add_special_tokens=False)]
    assert plan.assemble(encoded) == list(backend.encode(text, add_special_tokens=True).ids)
    with pytest.raises(ValueError, match="encodings for"):
        plan.assemble(encoded[:-1])
    whole = Plan.whole(text, True)
    ids = list(backend.encode(text).ids)
    assert whole.assemble([ids]) == ids and whole.chars == len(text)


@pytest.mark.parametrize("value, expected", [(None, None), (0, 0), (4096, 4096)])
def test_the_threshold_comes_from_the_profile_and_null_keeps_every_encode_on_the_loop(
        value: int | None, expected: int | None) -> None:
    from fleetgate.router.build import build_scheduler
    from fleetgate.router.config import precise_prefix_config

    params: dict[str, object] = {"tokenizer": "local", "tokenizerPaths": {"*": "/m"}}
    if value is not None:
        params["tokenizeThreadMinChars"] = value
    def tokenizer() -> LocalTokenizer:
        scheduler = build_scheduler(precise_prefix_config(params), scrape=False)
        scorer = next(s for s, _ in scheduler.profile.scorers if s.name == "prefix")
        assert isinstance(scorer, PrecisePrefixScorer) and isinstance(scorer.tokenizer, LocalTokenizer)
        return scorer.tokenizer

    assert tokenizer().thread_min_chars == expected
    params["tokenizeThreadMinChars"] = None  # YAML's null: the old path, for an A/B on the same machine
    assert tokenizer().thread_min_chars is None
