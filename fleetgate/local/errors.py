"""Errors of the local stack: each message says what went wrong and the command that fixes it."""

from __future__ import annotations


class LocalStackError(Exception):
    """A failure of `fleetgate up` / `fleetgate prepare-model` that the user can act on."""


class ModelPrepError(LocalStackError):
    """The packaged model is missing or corrupt, or could not be converted."""


class EngineStartError(LocalStackError):
    """An engine subprocess died or never became healthy; the message carries its log tail."""
