"""How chat messages become a prompt for the packaged Gemma 3 270M, which the GGUF does not say.

The package holds the *pretrained* (base) Gemma 3 270M, not the instruction-tuned one. Gemma's
turn markers (`<start_of_turn>user ... <end_of_turn>`) are untrained in a base model: rendered
with them it answers "What is the capital of France?" with noise. As a plain dialogue it answers
well and ends its turn with a blank line (token 108, "\\n\\n"), measured on this package:

    <bos>[system text]\\n\\nUser: What is the capital of France?\\n\\nAssistant:
    ->  " The capital of France is Paris." then "\\n\\n" then "User: ..." (which the stop cuts off)

So the chat template renders that dialogue (string content or a list of `{"type": "text"}` parts;
system/developer text as a leading paragraph) and `generation_config.json` lists `<eos>` (1),
`<end_of_turn>` (106) and "\\n\\n" (108) as end tokens. vLLM applies end tokens to every request, so
plain `/v1/completions` also stop at a blank line with this model; an instruction-tuned model
(`engine.model_path`) brings its own template and generation config.

The tokenizer adds `<bos>` for plain completions; vLLM renders chat prompts with the template and
tokenizes them without special tokens, so the template emits `bos_token` itself.
"""

from __future__ import annotations

from typing import Any

BOS_ID = 2
EOS_ID = 1
PAD_ID = 0
END_OF_TURN_ID = 106
END_OF_TURN = "<end_of_turn>"
BLANK_LINE_ID = 108  # "\n\n"

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is none -%}{%- set text = '' -%}"
    "{%- elif message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('\\n') -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' or message['role'] == 'developer' -%}"
    "{{- (text | trim) + '\\n\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- 'Assistant: ' + (text | trim) + '\\n\\n' -}}"
    "{%- else -%}"
    "{{- 'User: ' + (text | trim) + '\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def generation_config() -> dict[str, Any]:
    """`generation_config.json`: vLLM stops on every id in `eos_token_id`."""
    return {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, END_OF_TURN_ID, BLANK_LINE_ID], "pad_token_id": PAD_ID}
