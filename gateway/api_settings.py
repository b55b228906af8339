"""Configuration of the API routes beyond chat and completions (`responses:` in the gateway's file)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ResponsesSettings(BaseModel):
    """`/v1/responses`: how long the gateway keeps a stored response's conversation (`conversations`)."""

    model_config = ConfigDict(extra="forbid")

    store_ttl_s: float = Field(
        default=86400.0, gt=0,
        description="a stored response (store: true) can be named by previous_response_id, retrieved or deleted "
                    "for this long after it was created",
    )
    max_stored_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0,
        description="a conversation longer than this (JSON bytes) is not stored; a follow-up naming it gets 404",
    )
