"""The chat template and generation config written into the prepared Gemma 3 270M directory."""

from __future__ import annotations

import jinja2
import pytest

from fleetgate.local import gemma_format


def _render(messages: list[dict[str, object]], *, add_generation_prompt: bool = True) -> str:
    env = jinja2.Environment()
    template = env.from_string(gemma_format.CHAT_TEMPLATE)
    return template.render(messages=messages, bos_token="<bos>", add_generation_prompt=add_generation_prompt)


def test_one_question_becomes_a_dialogue_prompt() -> None:
    prompt = _render([{"role": "user", "content": "What is the capital of France?"}])
    assert prompt == "<bos>User: What is the capital of France?\n\nAssistant:"


def test_system_history_and_content_parts() -> None:
    prompt = _render(
        [
            {"role": "system", "content": "Answer briefly. "},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Capital of Italy?"},
        ]
    )
    assert prompt == "<bos>Answer briefly.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Capital of Italy?\n\nAssistant:"


def test_no_generation_prompt_and_empty_content() -> None:
    assert _render([{"role": "assistant", "content": None}], add_generation_prompt=False) == "<bos>Assistant: \n\n"


@pytest.mark.parametrize("token_id", [gemma_format.EOS_ID, gemma_format.END_OF_TURN_ID, gemma_format.BLANK_LINE_ID])
def test_generation_stops_at_each_end_token(token_id: int) -> None:
    config = gemma_format.generation_config()
    assert token_id in config["eos_token_id"]
    assert config["bos_token_id"] == gemma_format.BOS_ID
