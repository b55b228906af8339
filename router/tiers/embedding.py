"""The MiniLM sentence embedder the tier scorer uses when the cache did not compute an embedding.

It is the kernel's fast backend, MiniLM on ONNX Runtime (`fleetgate.core.minilm_onnx`, fp32 here: cosine
>= 0.99999 to the sentence-transformers reference on every eval prompt), so a gateway with tiers but no
cache never loads torch, and the scorer trained on reference vectors sees the same vectors. When the cache
has a MiniLM embedder the gateway hands that one to the tier router instead, and an embedding the cache
computed for a request is reused as is.
"""

from __future__ import annotations

from fleetgate.core.minilm import MINILM_DIM
from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder as MiniLMEmbedder

EMBEDDING_DIM = MINILM_DIM

__all__ = ["EMBEDDING_DIM", "MiniLMEmbedder"]
