"""The MiniLM sentence embedder the tier scorer uses when the cache did not compute an embedding.

It is the kernel's one loader (`fleetgate.core.minilm`), the same model and instance type the semantic
cache uses, so an embedding the cache computed for a request is reused as is.
"""

from __future__ import annotations

from fleetgate.core.minilm import MINILM_DIM, MiniLMEmbedder

EMBEDDING_DIM = MINILM_DIM

__all__ = ["EMBEDDING_DIM", "MiniLMEmbedder"]
