"""Cascade escalation: when does a cheap tier's complete answer count as failed?"""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.router.tiers.config import Cascade
from fleetgate.router.tiers.escalation import compile_refusals, escalation_reason, mean_logprob


def chat(content: Any = "The answer is 42.", *, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "model": "m-small",
        "choices": [
            {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content, **message}}
        ],
    }


def reason(response: dict[str, Any], **cascade: Any) -> str | None:
    cfg = Cascade(enabled=True, **cascade)
    return escalation_reason(response, cascade=cfg, refusals=compile_refusals(cfg.refusal_patterns))


def test_a_good_answer_is_kept() -> None:
    assert reason(chat()) is None


def test_cut_off_answer_escalates_unless_disabled() -> None:
    assert reason(chat(finish="length")) == "length"
    assert reason(chat(finish="length"), on_length=False) is None


@pytest.mark.parametrize("content", ["", "   \n", None])
def test_empty_answer_escalates(content: Any) -> None:
    assert reason(chat(content)) == "empty"


def test_tool_calls_without_text_are_not_empty() -> None:
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert reason(chat(None, tool_calls=call)) is None


def test_no_choices_counts_as_empty() -> None:
    assert reason({"choices": []}) == "empty"


@pytest.mark.parametrize(
    "content",
    [
        "I can't help with that request.",
        "I'm not able to solve this puzzle.",
        "I am unable to determine the answer.",
        "Sorry, but I cannot do that.",
        "  I don't know the answer to that.",
        "As an AI language model, I have no opinion.",
        "I\u2019m sorry, but that is beyond me.",
    ],
)
def test_refusals_at_the_start_escalate(content: str) -> None:
    assert reason(chat(content)) == "refusal"


def test_a_refusal_quoted_later_in_a_real_answer_does_not_escalate() -> None:
    text = "Here is the fixed email. " + "x" * 250 + " The customer wrote: 'I can't log in.'"
    assert reason(chat(text)) is None
    assert reason(chat("I can't help with that."), on_refusal=False) is None


def test_refusal_field_and_custom_patterns() -> None:
    assert reason(chat(None, refusal="policy")) == "refusal"
    assert reason(chat("Beyond my skills, friend."), refusal_patterns=[r"beyond my skills"]) == "refusal"


def test_low_mean_logprob_escalates_chat_and_completions() -> None:
    low = chat()
    low["choices"][0]["logprobs"] = {"content": [{"token": "a", "logprob": -4.0}, {"token": "b", "logprob": -2.0}]}
    assert mean_logprob(low["choices"][0]) == pytest.approx(-3.0)
    assert reason(low) == "low-logprob"
    assert reason(low, min_mean_logprob=-3.5) is None
    assert reason(low, min_mean_logprob=None) is None
    def completion(logprobs: list[float | None]) -> dict[str, Any]:
        return {"choices": [{"text": "42", "finish_reason": "stop", "logprobs": {"token_logprobs": logprobs}}]}

    assert reason(completion([None, -0.1])) is None  # the first prompt token has no log-prob
    assert reason(completion([-5.0, -3.0])) == "low-logprob"
