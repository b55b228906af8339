"""What an API route beyond chat and completions supplies to the gateway: `ApiRoute`.

The stages (tenancy, limits and budgets, cache, tiers, routing, accounting) are the chat pipeline's own
(the shared `flow.Flow`'s admission and finishing steps, `pipeline.Pipeline`'s forwarder); a route supplies only
what its API makes different: where the key is (`authorization`), parsing and validation with errors in its own shape
(`parse`, `render_error`), what the engine will read and generate (`reserve_shape`), the engine's
body (`upstream_body`), and how its answers look (`rewriter` for event streams, `answer` for one JSON body,
`replay` for a cache hit). `api_pipeline.ApiPipeline` drives a route through the stages.

Routes: `api_responses` (`/v1/responses`), `api_messages` (`/v1/messages`), `api_embeddings`
(`/v1/embeddings`), each proxied to the engine's own endpoint of the same path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fleetgate.core.errors import FleetGateError
from fleetgate.core.types import Usage
from fleetgate.gateway.api_events import ApiEvents
from fleetgate.gateway.errors import error_body
from fleetgate.gateway.flow import ReserveShape
from fleetgate.gateway.parsing import Kind, ParsedRequest, load_body
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.validation import check_depth


class ApiRoute(Protocol):
    kind: Kind
    path: str  # the client's path, and the engine's
    streamed: bool  # answers are event streams (non-streaming requests are collected from one); else one JSON body
    aliases: bool  # tier aliases may serve it

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        """The credential to authenticate, as an `Authorization` header value."""
        ...

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        """Validate; raise `InvalidRequestError` naming the field."""
        ...

    async def prepare(self, parsed: ParsedRequest, tenant: Tenant) -> None:
        """Complete the request before it is estimated (the stored conversation a follow-up names)."""
        ...

    def reserve_shape(self, parsed: ParsedRequest) -> ReserveShape:
        """What the request is reserved as: the body as the engine renders it, its prompts, its output limit."""
        ...

    def upstream_body(self, parsed: ParsedRequest, *, served: str, max_tokens: int | None) -> bytes:
        """The engine's body: its served model name, the output limit the reservation set (`max_tokens`)."""
        ...

    def render_error(self, exc: FleetGateError) -> bytes: ...

    def rewriter(self, parsed: ParsedRequest, *, endpoint_id: str, model_name: str | None, cap: int | None,
                 collect: bool) -> ApiEvents:
        """A `streamed` route's engine events; `model_name`: the name to show instead of the engine's."""
        ...

    def is_answer(self, obj: dict[str, Any]) -> bool:
        """Whether an engine's JSON body is an answer of this API."""
        ...

    def usage_of(self, obj: dict[str, Any]) -> Usage | None:
        """An answer's usage as the gateway charges it (None: missing or malformed)."""
        ...

    def replay(self, parsed: ParsedRequest, response: dict[str, Any]) -> list[bytes]:
        """A cached answer as this API's stream."""
        ...

    def from_cache(self, parsed: ParsedRequest, response: dict[str, Any]) -> dict[str, Any]:
        """A cached answer as served now (a new id where ids matter)."""
        ...

    async def completed(self, parsed: ParsedRequest, tenant: Tenant, answer: dict[str, Any]) -> None:
        """A complete answer is about to reach the client (stored for follow-ups where the API keeps state)."""
        ...


def load_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object with a model, nested no deeper than the gateway re-serialises."""
    body = load_body(raw)
    check_depth(body)
    return body


def parsed_request(kind: Kind, body: dict[str, Any], raw: bytes, *, max_tokens: int | None, prompt_text: str,
                   session_key: str | None) -> ParsedRequest:
    return ParsedRequest(kind=kind, body=body, model=body["model"], stream=bool(body.get("stream")),
                         include_usage=False, continuous_usage=False, max_tokens=max_tokens, prompt_text=prompt_text,
                         session_key=session_key or None, raw=raw)


class BaseRoute:
    """An `ApiRoute`'s defaults: a bearer key, OpenAI's errors, no state."""

    streamed = True
    aliases = True

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization")

    def render_error(self, exc: FleetGateError) -> bytes:
        return error_body(exc)

    async def prepare(self, parsed: ParsedRequest, tenant: Tenant) -> None:
        return None

    def from_cache(self, parsed: ParsedRequest, response: dict[str, Any]) -> dict[str, Any]:
        return response

    async def completed(self, parsed: ParsedRequest, tenant: Tenant, answer: dict[str, Any]) -> None:
        return None


class TemplatedRoute(BaseRoute):
    """A route the engine turns into a chat request and renders with the chat template (responses, messages):
    its bound is the chat bound of the body, with the tools in the chat shape the engine converts them to; where
    the bound would refuse, the engine's exact count (`token_count`, `chat_views`)."""

    def chat_tools(self, tools: list[Any]) -> list[Any]:
        raise NotImplementedError

    def reserve_shape(self, parsed: ParsedRequest) -> ReserveShape:
        body = parsed.body
        tools = body.get("tools")
        view = {**body, "tools": self.chat_tools(tools)} if isinstance(tools, list) and tools else body
        return ReserveShape(body=view, prompts_field=None, max_tokens=parsed.max_tokens, kind=parsed.kind,
                            count_body=body)


def served_model(obj: dict[str, Any], name: str | None) -> None:
    """Name what the gateway served in an answer object (the engine's own name may differ)."""
    if name is not None and isinstance(obj, dict):
        obj["model"] = name
