"""`OnnxMiniLMEmbedder`: the MiniLM embedder on ONNX Runtime, the gateway's fast path.

Same model, same vectors as the reference `MiniLMEmbedder` (sentence-transformers): the graph from
`fleetgate.core.minilm_export` holds encoder, mean pooling and normalisation, and the tokenizer is the
model's own `tokenizer.json` run by the `tokenizers` library (Rust, what sentence-transformers uses too),
truncated at the model's 256 tokens. A batch is sorted by token count and run in groups of similar length
(padding at most `_MAX_PADDING` of a group's tokens): padded positions cost as much as real ones, and
with mixed lengths one padded run cost more per text than running the texts one by one. onnxruntime is imported on
first load; `intra_op_threads` is ORT's thread count for this session only (1 suits a gateway where
requests are the parallelism; more helps large offline batches); idle pool threads never spin.

Token states: with a sink attached (`keep_states`, the verifier's `fleetgate.cache.tokenalign.TokenStates`)
the session is built from the same file with the last encoder layer's output (its last LayerNormalization,
batch x tokens x 384) added as a second graph output (`states_graph`), and every text `embed` encodes hands
its row of it, cut to the text's own tokens, and the tokenizer's character offsets to the sink: the pass that
embeds a text also gives its token states. The pooled vectors are the same, bit for bit, and so is a padded
row's states to a text run alone (measured on the eval prompts; padded positions are masked out of
attention, and int8 quantises activations per row). `token_states(text)` runs one text alone for the sink's
texts that no embedding brought.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

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


def states_graph(path: Path) -> tuple[bytes, str]:
    """The ONNX file at `path` with the last encoder layer's output (the last LayerNormalization: the
    contextual token states, batch x tokens x 384) added as a graph output: (the serialised graph, the name
    of that output). The graph's other output, the pooled embedding, is unchanged."""
    import onnx

    model = onnx.load(str(path))
    last = [n for n in model.graph.node if n.op_type == "LayerNormalization"][-1].output[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(last, onnx.TensorProto.FLOAT, None))
    return model.SerializeToString(), last


class StatesSink(Protocol):
    def offer(self, text: str, states: np.ndarray, offsets: np.ndarray) -> None:
        """`text`'s token states (tokens x 384 float32, [CLS] and [SEP] included, an array of its own) and
        the tokenizer's (start, end) character offsets per token (tokens x 2). Called on the embedding thread."""
        ...


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
        self.model_dir = model_dir
        self.variant: OnnxVariant = variant
        self._threads = intra_op_threads
        # (session, name of its token-state output or None): one reference, swapped whole when reloaded
        self._loaded: tuple[Any, str | None] | None = None
        self._tokenizer: Any | None = None
        self._sink: StatesSink | None = None
        self._lock = threading.Lock()
        self.runs = 0  # session runs (tests, diagnostics)

    def load(self) -> None:
        """Load tokenizer and session now (blocking; exports the ONNX file first if missing)."""
        self._load(states=self._sink is not None)

    def _load(self, *, states: bool) -> tuple[Any, str | None]:
        with self._lock:
            loaded = self._loaded
            if loaded is not None and (loaded[1] is not None or not states):
                return loaded
            folder = self.model_dir or minilm_dir()
            tokenizer = self._tokenizer or minilm_tokenizer(folder)  # `embed` pads per group of similar length
            path = ensure_onnx(model_dir=folder, variant=self.variant)
            if states:
                graph, output = states_graph(path)
                loaded = (cpu_session(graph, threads=self._threads), output)
            else:
                loaded = (cpu_session(str(path), threads=self._threads), None)
            self._tokenizer = tokenizer
            self._loaded = loaded
            return loaded

    def keep_states(self, sink: StatesSink) -> None:
        """From now on, hand `sink` the token states of every text embedded (reloads the session with the
        token-state output if it was loaded without it)."""
        self._sink = sink
        if self._loaded is not None and self._loaded[1] is None:
            self._load(states=True)

    def _encode(self, texts: Sequence[str]) -> list[Any]:
        if self._tokenizer is None:
            self.load()
        assert self._tokenizer is not None
        return list(self._tokenizer.encode_batch(list(texts)))

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The model's token ids of each text, truncated at 256, unpadded (loads the model when needed)."""
        return [e.ids for e in self._encode(texts)]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), 384), each row L2-normalised (with a sink attached, each text's
        token states go to it as well)."""
        if not texts:
            return np.zeros((0, MINILM_DIM), dtype=np.float32)
        encoded = self._encode(texts)
        sink = self._sink
        session, output = self._loaded or self._load(states=sink is not None)
        names = ["embedding"] if sink is None or output is None else ["embedding", output]
        out = np.empty((len(texts), MINILM_DIM), dtype=np.float32)
        for group in length_groups([len(e.ids) for e in encoded]):
            longest = max(len(encoded[i].ids) for i in group)
            ids = np.zeros((len(group), longest), dtype=np.int64)  # 0 = [PAD]
            mask = np.zeros((len(group), longest), dtype=np.int64)
            for row, i in enumerate(group):
                ids[row, : len(encoded[i].ids)] = encoded[i].ids
                mask[row, : len(encoded[i].ids)] = 1
            self.runs += 1
            results = session.run(names, {"input_ids": ids, "attention_mask": mask})
            out[group] = np.asarray(results[0], dtype=np.float32)
            if len(results) > 1 and sink is not None:
                for row, i in enumerate(group):
                    n = len(encoded[i].ids)  # the row's own tokens: its padding cut off
                    sink.offer(texts[i], np.array(results[1][row, :n], dtype=np.float32),
                               np.array(encoded[i].offsets, dtype=np.int64).reshape(n, 2))
        return out

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph on token ids already padded (int64, batch x tokens): (batch, 384) normalised vectors."""
        session, _ = self._loaded or self._load(states=self._sink is not None)
        self.runs += 1
        (vectors,) = session.run(["embedding"], {"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(vectors, dtype=np.float32)

    def token_states(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """One text run alone (unpadded, blocking): its token states (tokens x 384 float32) and the
        tokenizer's character offsets per token (tokens x 2), as `embed` hands them to the sink."""
        (encoding,) = self._encode([text])
        session, output = self._load(states=True)
        assert output is not None
        ids = np.array([encoding.ids], dtype=np.int64)
        self.runs += 1
        (states,) = session.run([output], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return (np.asarray(states[0], dtype=np.float32),
                np.array(encoding.offsets, dtype=np.int64).reshape(len(encoding.ids), 2))
