"""The Responses API's stored responses, kept by the gateway (shared `KVStore`: Redis across replicas).

vLLM keeps `previous_response_id` state in the memory of the engine process that answered, off by default
(`VLLM_ENABLE_RESPONSES_API_STORE`) and never evicted. The gateway keeps it instead: each stored response is
one record under the tenant's own key, holding the whole conversation up to and including it (every input
item of the chain, then this response's output items) and the response object as the client got it. A
follow-up's input is that conversation plus its own new items, sent in full to whichever engine the router
picks, with `store: false` upstream so no engine keeps anything. So:

- any replica of the gateway and any engine replica can answer a follow-up, also after an engine restart,
  a scale-down or a scale from zero (affinity to the answering engine would break on each of those);
- the reservation counts everything the engine will read, the stored conversation included;
- another tenant's response id does not exist for a tenant (a 404, as an unknown one).

One record per response, each a full copy of its conversation: a follow-up costs one read, whatever the
chain's length. Records expire `responses.store_ttl_s` after they were written; a conversation above
`responses.max_stored_bytes` is not stored (it could not be sent to an engine anyway: contexts are smaller).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.core.errors import InvalidRequestError, UpstreamUnavailableError
from fleetgate.core.kvstore import KVStore

log = logging.getLogger("fleetgate.gateway.responses")

MAX_ID_CHARS = 200


class StoreDownError(UpstreamUnavailableError):
    code = "conversation_store_unavailable"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    items: list[Any]  # the conversation up to and including this response: input items, then its output items
    response: dict[str, Any]  # the response object as the client got it
    session: str = ""  # the conversation's session key (routing affinity for its follow-ups)


def checked_id(response_id: Any, *, param: str) -> str:
    """A response id from a client: a short printable token (it becomes part of a store key)."""
    if (not isinstance(response_id, str) or not response_id or len(response_id) > MAX_ID_CHARS
            or not response_id.isascii() or not response_id.isprintable() or any(c in response_id for c in " :*?[]")):
        raise InvalidRequestError(f"'{param}' must be a response id", param=param)
    return response_id


class ConversationStore:
    def __init__(self, kv: KVStore, *, ttl_s: float, max_bytes: int) -> None:
        self._kv = kv
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes

    @staticmethod
    def _key(tenant: str, response_id: str) -> str:
        return f"responses:{tenant}:{response_id}"

    async def load(self, *, tenant: str, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, expired, deleted, another tenant's); 503 when the store
        cannot be read."""
        try:
            raw = await self._kv.get(self._key(tenant, response_id))
        except Exception as exc:
            log.warning("conversation store read failed", extra={"error": repr(exc)})
            raise StoreDownError("the gateway's conversation store is unavailable; retry the request") from exc
        if raw is None:
            return None
        record = orjson.loads(raw)
        return StoredResponse(items=record["items"], response=record["response"], session=record.get("session", ""))

    async def save(self, *, tenant: str, response_id: str, stored: StoredResponse) -> bool:
        """Store a response; False (logged) when it is too large or the store failed."""
        raw = orjson.dumps({"items": stored.items, "response": stored.response, "session": stored.session})
        if len(raw) > self._max_bytes:
            log.warning("conversation not stored: too large", extra={"tenant": tenant, "bytes": len(raw)})
            return False
        try:
            await self._kv.set(self._key(tenant, response_id), raw, ttl_s=self._ttl_s)
        except Exception as exc:
            log.warning("conversation store write failed", extra={"tenant": tenant, "error": repr(exc)})
            return False
        return True

    async def delete(self, *, tenant: str, response_id: str) -> bool:
        """True when the response existed for this tenant."""
        if await self.load(tenant=tenant, response_id=response_id) is None:
            return False
        await self._kv.delete(self._key(tenant, response_id))
        return True
