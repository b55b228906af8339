"""The base of every typed spec model (`spec.py`, `spec_pod.py`): camelCase on the wire, unknown fields
refused, immutable; and the helpers that put CEL rules and defaults into the generated CRD schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def rules(*pairs: tuple[str, str]) -> dict[str, Any]:
    """CEL rules (rule, message) as the CRD's `x-kubernetes-validations` of a model."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in pairs]}


def empty_default(schema: dict[str, Any]) -> None:
    """The API server fills nested defaults only inside objects that exist; `default: {}` makes them exist."""
    schema["default"] = {}


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
