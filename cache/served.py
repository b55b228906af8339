"""A stored answer as the cache serves it now: a fresh id in the API's own form and a fresh creation time.

The usage stays the original one (the tokens the cache saved). Pure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

# Each API's id prefix; "fgc" after it marks an answer served from the cache.
ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "messages": "msg_"}


def served_response(record: Mapping[str, Any], *, kind: str) -> dict[str, Any]:
    """The response stored in `record`, with a new id and creation time for a request of `kind`."""
    response = dict(record["response"])
    response["id"] = ID_PREFIX.get(kind, "cmpl-") + "fgc" + uuid.uuid4().hex
    if kind in ("chat", "completions"):
        response["created"] = int(time.time())
    elif kind == "responses":
        response["created_at"] = int(time.time())
    return response
