"""`fleetgate bench engine --compare`'s quality figures from vLLM answers: no engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fleetgate.local import quant_bench
from fleetgate.local.quant_bench import (
    PromptLogprobs,
    perplexity,
    teacher_forced_matches,
    text_chunks,
    token_logprobs,
)


def _entry(*pairs: tuple[int, float, int]) -> dict[str, dict[str, object]]:
    """vLLM 0.32's JSON for one prompt position: token id (a string key) -> logprob, rank, decoded_token."""
    return {str(t): {"logprob": lp, "rank": rank, "decoded_token": f"t{t}"} for t, lp, rank in pairs}


# Prompt [2, 10, 11, 12, 13]: prompt [2, 10], continuation [11, 12, 13] from the reference model.
SCORED: PromptLogprobs = [
    None,
    _entry((10, -3.0, 4), (7, -0.5, 1)),
    _entry((11, -0.1, 1)),  # the scored model's top-1 is the reference's token: one entry
    _entry((12, -2.0, 2), (99, -0.2, 1)),  # the scored model prefers 99
    _entry((13, -0.3, 1)),  # after a miss, still judged on the reference's prefix
]


def test_teacher_forced_matches_counts_rank_one_positions_of_the_continuation() -> None:
    assert teacher_forced_matches(SCORED, tokens=[11, 12, 13], start=2) == 2
    assert teacher_forced_matches(SCORED, tokens=[], start=5) == 0


def test_teacher_forced_matches_rejects_a_token_vllm_did_not_score() -> None:
    with pytest.raises(ValueError, match="token 5 at position 2"):
        teacher_forced_matches(SCORED, tokens=[5], start=2)
    with pytest.raises(ValueError, match="position 0"):
        teacher_forced_matches(SCORED, tokens=[2], start=0)


def test_token_logprobs_skip_the_first_token_and_read_the_prompts_own_tokens() -> None:
    assert token_logprobs(SCORED, tokens=[2, 10, 11, 12, 13]) == [-3.0, -0.1, -2.0, -0.3]


def test_perplexity_is_exp_of_the_mean_negative_logprob() -> None:
    assert perplexity([math.log(0.5)] * 3) == pytest.approx(2.0)
    assert perplexity([0.0, 0.0]) == 1.0
    assert perplexity([-1.0, -3.0]) == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError):
        perplexity([])


def test_text_chunks_join_paragraphs_up_to_the_limit() -> None:
    text = "aaaa\n\nbbbb\n\n\n\ncccccccccc\n\ndd\n"
    assert text_chunks(text, max_chars=10) == ["aaaa\n\nbbbb", "cccccccccc", "dd"]
    assert text_chunks(text, max_chars=100) == ["aaaa\n\nbbbb\n\ncccccccccc\n\ndd"]


def test_the_heldout_text_ships_with_the_package_and_fits_one_chunk() -> None:
    text = quant_bench.heldout_text()
    assert 500 <= len(text.split()) <= 900  # ~600-1,000 tokens of plain prose
    assert len(text_chunks(text, max_chars=quant_bench.HELDOUT_CHUNK_CHARS)) == 1


def test_teacher_forced_agreement_pools_positions_over_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {(2, 10, 11, 12, 13): SCORED, (2, 20, 21): [None, _entry((20, -1.0, 1)), _entry((21, -0.7, 3))]}
    monkeypatch.setattr(quant_bench, "prompt_logprobs", lambda url, prompt: (list(prompt), answers[tuple(prompt)]))
    reference = [
        quant_bench.Greedy(tokens=["a", "b", "c"], prompt_ids=[2, 10], ids=[11, 12, 13]),
        quant_bench.Greedy(tokens=["x"], prompt_ids=[2, 20], ids=[21]),
    ]
    assert quant_bench.teacher_forced_agreement("http://engine", reference) == pytest.approx(2 / 4)


@pytest.mark.parametrize("argv", [["bench", "engine"], ["bench", "engine", "--compare", "gguf-e8"]])
def test_an_engine_that_never_becomes_healthy_ends_the_bench_with_its_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetgate.cli import main
    from fleetgate.local import engine_bench
    from fleetgate.local.engines import EngineFleet
    from fleetgate.local.errors import EngineStartError

    stopped: list[bool] = []

    def start(self: EngineFleet) -> float:
        stopped.append(False)
        raise EngineStartError("engine 0 exited with code 1 before becoming healthy; log engine-0.log")

    monkeypatch.setattr(EngineFleet, "start", start)
    monkeypatch.setattr(EngineFleet, "stop", lambda self: stopped.append(True))
    for module in (engine_bench, quant_bench):
        monkeypatch.setattr(module, "prepare_model", lambda **_: tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "fleetgate bench engine: engine 0 exited with code 1 before becoming healthy" in err
    assert "Traceback" not in err
    assert stopped == [False, True]  # the fleet was stopped on the way out
