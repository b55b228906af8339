"""`OnnxMiniLMEmbedder`: the MiniLM embedder on ONNX Runtime, the gateway's fast path.

Same model, same vectors as the reference `MiniLMEmbedder` (sentence-transformers): the graph from
`fleetgate.core.minilm_export` holds encoder, mean pooling and normalisation, and the tokenizer is the
model's own `tokenizer.json` run by the `tokenizers` library (Rust, what sentence-transformers uses too),
truncated at the model's 256 tokens. A batch is sorted by token count and run in groups of similar length
(padding at most `_MAX_PADDING` of a group's tokens): padded positions cost as much as real ones, and
with mixed lengths one padded run cost more per text than running the texts one by one. onnxruntime is imported on
first load; `intra_op_threads` is ORT's thread count for this session only (1 suits a gateway where
requests are the parallelism; more helps large offline batches); idle pool threads never spin.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.minilm import MINILM_DIM, minilm_dir
from fleetgate.core.minilm_export import OnnxVariant, ensure_onnx

_MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length: what the reference truncates at
_MAX_PADDING = 0.2  # share of a group's token positions that may be padding
_MAX_GROUP = 32


def length_groups(
    lengths: Sequence[int], *, max_padding: float = _MAX_PADDING, max_group: int = _MAX_GROUP
) -> list[list[int]]:
    """Indices of `lengths` in groups of similar length: sorted by length, a group grows while padding every
    member to its longest stays within `max_padding` of its positions and it has at most `max_group` members."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]  # sorted ascending: the newcomer is the group's longest
        if current and (len(current) >= max_group or (len(current) + 1) * n * (1 - max_padding) > total + n):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        groups.append(current)
    return groups


def minilm_tokenizer(folder: Path) -> Any:
    """MiniLM's own tokenizer (`tokenizers`), truncated at the reference's 256 tokens, unpadded."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=_MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def cpu_session(model: str | bytes, *, threads: int | None) -> Any:
    """An ONNX Runtime CPU session of `model` (a path or the serialised graph), graph optimisations on;
    `threads`: its intra-op threads (None: ORT's default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # a spinning idle pool thread would burn the gateway's core between batches
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class OnnxMiniLMEmbedder:
    """Thread-safe, lazily loaded MiniLM on ONNX Runtime. `embed` is blocking: call it off the event loop."""

    dim = MINILM_DIM

    def __init__(
        self, *, model_dir: Path | None = None, variant: OnnxVariant = "fp32", intra_op_threads: int | None = 1
    ) -> None:
        self._model_dir = model_dir
        self.variant: OnnxVariant = variant
        self._threads = intra_op_threads
        self._session: Any | None = None
        self._tokenizer: Any | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load tokenizer and session now (blocking; exports the ONNX file first if missing)."""
        with self._lock:
            if self._session is not None:
                return
            folder = self._model_dir or minilm_dir()
            tokenizer = minilm_tokenizer(folder)  # `embed` pads per group of similar length
            path = ensure_onnx(model_dir=folder, variant=self.variant)
            self._session = cpu_session(str(path), threads=self._threads)
            self._tokenizer = tokenizer

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The model's token ids of each text, truncated at 256, unpadded (loads the model when needed)."""
        if self._tokenizer is None:
            self.load()
        assert self._tokenizer is not None
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), 384), each row L2-normalised."""
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        encoded = self.token_ids(texts)
        assert self._session is not None
        out = np.empty((len(texts), MINILM_DIM), dtype=np.float32)
        for group in length_groups([len(ids) for ids in encoded]):
            longest = max(len(encoded[i]) for i in group)
            ids = np.zeros((len(group), longest), dtype=np.int64)  # 0 = [PAD]
            mask = np.zeros((len(group), longest), dtype=np.int64)
            for row, i in enumerate(group):
                ids[row, : len(encoded[i])] = encoded[i]
                mask[row, : len(encoded[i])] = 1
            out[group] = self.run(ids, mask)
        return out

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph on token ids already padded (int64, batch x tokens): (batch, 384) normalised vectors."""
        if self._session is None:
            self.load()
        assert self._session is not None
        (vectors,) = self._session.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(vectors, dtype=np.float32)
