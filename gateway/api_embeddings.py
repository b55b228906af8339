"""`POST /v1/embeddings`, proxied to the engine's own `/v1/embeddings` (an embedding model: vLLM's pooling runner).

Inputs are OpenAI's: a string, a list of strings, a list of token ids or a list of such lists (at most
`MAX_INPUTS`), plus vLLM's chat-style `messages` (one templated prompt). The reservation counts every input
(the prompt bound of each, exact for token ids) and no completion; the tenant is billed the engine's
`usage.prompt_tokens` at the model's input rate. vLLM's `padding: "max_length"` makes the engine read each
input padded to the model's length: it is reserved at the context length per input, and refused where that
length is not known (there would be no bound). Tier aliases never serve embeddings (an alias picks among
generative models), and the response cache does not store them (`cache.policy`: a paraphrase must not get
another text's vector).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.types import Usage
from fleetgate.gateway.api_events import ApiEvents
from fleetgate.gateway.api_route import BaseRoute, load_object, parsed_request
from fleetgate.gateway.engine_usage import parse_usage
from fleetgate.gateway.estimate import RequestEstimate
from fleetgate.gateway.flow import ReserveShape
from fleetgate.gateway.parsing import Kind, ParsedRequest, chat_prompt_text
from fleetgate.gateway.validation import Check, check_fields, check_messages, fail, int_in, string

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _input(param: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value and len(value) <= MAX_INPUTS:
        if all(isinstance(v, str) for v in value) or all(_is_int(v) for v in value):
            return
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return
    raise fail(param, f"must be a string, a list of strings, a list of token ids or a list of such lists, with "
                      f"1 to {MAX_INPUTS} inputs")


def _one_of(*values: str) -> Check:
    def check(param: str, value: Any) -> None:
        if value not in values:
            raise fail(param, f"must be one of {', '.join(values)}")

    return check


CHECKS: dict[str, Check] = {
    "input": _input,
    "encoding_format": _one_of("float", "base64"),
    "dimensions": int_in(1),
    "user": string,
    "padding": _one_of("max_length", "do_not_pad"),
}


def _padded(estimate: RequestEstimate, context: int | None) -> RequestEstimate:
    """vLLM pads each input to the model's length (`padding: max_length`): that many tokens each."""
    if context is None:
        raise InvalidRequestError("'padding: max_length' pads every input to the model's length, which the gateway "
                                  "does not know for this model", param="padding")
    tokens = context * estimate.prompts
    return RequestEstimate(prompt_tokens=tokens, sequences=estimate.sequences, typical=tokens,
                           prompts=estimate.prompts)


def _prompt_text(body: Mapping[str, Any]) -> str:
    if "messages" in body:
        return chat_prompt_text(body["messages"])
    value = body["input"]
    return value if isinstance(value, str) else "\n".join(v if isinstance(v, str) else str(v) for v in value)


class EmbeddingsRoute(BaseRoute):
    kind: Kind = "embeddings"
    path = "/v1/embeddings"
    streamed = False
    aliases = False

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        body = load_object(raw)
        if "messages" in body and "input" not in body:
            check_messages(body["messages"])
        elif "input" not in body:
            raise InvalidRequestError("'input' is required", param="input")
        elif "messages" in body:
            raise InvalidRequestError("give 'input' or 'messages', not both", param="messages")
        check_fields(body, CHECKS)
        if body.get("stream"):
            raise InvalidRequestError("embeddings are not streamed", param="stream")
        return parsed_request(self.kind, body, raw, max_tokens=None, prompt_text=_prompt_text(body),
                              session_key=headers.get("x-session-id"))

    def reserve_shape(self, parsed: ParsedRequest) -> ReserveShape:
        """Every input's bound and no completion (`max_tokens: 0`); padded inputs at the model's length each."""
        body = parsed.body
        padded = body.get("padding") == "max_length"
        return ReserveShape(body=body, prompts_field=None if "messages" in body else "input", max_tokens=0,
                            adjust=_padded if padded else None)

    def upstream_body(self, parsed: ParsedRequest, *, served: str, max_tokens: int | None) -> bytes:
        if parsed.raw and parsed.body.get("model") == served:
            return parsed.raw
        return orjson.dumps({**parsed.body, "model": served})

    def rewriter(self, parsed: ParsedRequest, *, endpoint_id: str, model_name: str | None, cap: int | None,
                 collect: bool) -> ApiEvents:
        raise NotImplementedError("embeddings are answered in one body")

    def is_answer(self, obj: dict[str, Any]) -> bool:
        return isinstance(obj.get("data"), list)

    def usage_of(self, obj: dict[str, Any]) -> Usage | None:
        return parse_usage(obj.get("usage"))

    def replay(self, parsed: ParsedRequest, response: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError("embeddings are never streamed nor cached")
