"""`StaticMiniLM`: static token vectors distilled from MiniLM, for the semantic cache's candidate search.

A prompt's vector is the mean of its tokens' rows in a table, normalised: a few microseconds against
milliseconds for the encoder. The cache ranks and pre-screens candidates with it
(`fleetgate.cache.twolayer`, `semantic.prefilter`); the encoder still gives every similarity that decides
a hit, and runs only when a candidate survives the text checks.

The table is built once per MiniLM folder, by model2vec's recipe (Tulkens & van Dongen, 2024), written here
with numpy and ONNX Runtime (the model2vec package's distiller pins tokenizers below what vLLM needs):
1. every vocabulary token through the encoder alone (`[CLS] token [SEP]`; the exported graph's mean
   pooling and normalisation): MiniLM's own sentence vector of that one token;
2. the rows centred and reduced to `DIM` dimensions by PCA (the leading components carry the
   distinctions; the rest is mostly noise the mean of a few rows would average badly);
3. each row weighted by a / (a + p), p the token's English word frequency (`wordfreq`): smooth inverse
   frequency, so "the", "how", "please" weigh little and "kubectl", "mortgage" a lot;
4. the direction every prompt shares removed: the frequency-weighted mean of the weighted rows (what an
   average English sentence's tokens add up to).
`a` and `DIM` were chosen on development pairs (dev, frozen, frozen2): the share of the pairs the cache
accepts whose stored prompt is among a query's 8 nearest, with all ~2,600 of their prompts stored in one
partition (89.6%; MiniLM itself: 99.7%), against the table's PCA-on-the-table and unweighted variants.
The file is written beside the model under a temporary name and renamed into place; ~16 MB (float16);
building it took 15 s of encoder time on a quiet box and 116 s on the busy shared one.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.minilm import minilm_dir

DIM = 256
SIF_A = 3e-2
_MAX_TOKENS = 256  # what the tokenizer truncates at (`minilm_onnx.minilm_tokenizer`)
# Token ids per space-separated chunk, memoised: a lookup's words are mostly ones seen before, and a dict hit
# costs well under a microsecond where the Rust tokenizer's `encode` (offsets, `Encoding` object) costs ~30
# µs a prompt. Bounded in entries and in the length of a chunk it keeps.
_MEMO_ENTRIES = 65_536
_MEMO_CHUNK_CHARS = 64
_FILE = f"minilm-static-{DIM}-v2.npy"


def static_file(model_dir: Path) -> Path:
    return model_dir / _FILE


def _token_vectors(model_dir: Path, vocab_size: int, *, batch: int = 512) -> np.ndarray:
    """MiniLM's sentence vector of each vocabulary token alone (fp32 ONNX graph; exported first if missing)."""
    from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder

    encoder = OnnxMiniLMEmbedder(model_dir=model_dir, variant="fp32", intra_op_threads=None)
    encoder.load()
    out = np.zeros((vocab_size, encoder.dim), dtype=np.float32)
    for start in range(0, vocab_size, batch):
        n = min(batch, vocab_size - start)
        ids = np.empty((n, 3), dtype=np.int64)
        ids[:, 0], ids[:, 1], ids[:, 2] = 101, np.arange(start, start + n), 102  # [CLS] token [SEP]
        out[start : start + n] = encoder.run(ids, np.ones((n, 3), dtype=np.int64))
    return out


def distill(raw: np.ndarray, tokens: Sequence[str], *, dim: int = DIM, a: float = SIF_A) -> np.ndarray:
    """Steps 2-4 of the recipe: PCA to `dim`, smooth-inverse-frequency weights, the shared direction removed."""
    from wordfreq import word_frequency

    centred = raw - raw.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    table = centred @ vt[:dim].T
    freq = np.array([word_frequency(t.removeprefix("##"), "en") for t in tokens])
    table *= (a / (a + freq))[:, None]
    shared = (table * (freq / max(freq.sum(), 1e-12))[:, None]).sum(axis=0)
    shared /= max(float(np.linalg.norm(shared)), 1e-12)
    return (table - np.outer(table @ shared, shared)).astype(np.float32)


def build(model_dir: Path) -> Path:
    """Distil the table into `model_dir` (atomically) unless it is there; returns the file."""
    from tokenizers import Tokenizer

    target = static_file(model_dir)
    if target.is_file():
        return target
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    tokens = [vocab.get(i, "") for i in range(tokenizer.get_vocab_size())]
    table = distill(_token_vectors(model_dir, len(tokens)), tokens)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", suffix=".npy", dir=model_dir)
    os.close(fd)
    os.chmod(tmp, 0o644)
    try:
        np.save(tmp, table.astype(np.float16))
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


class StaticMiniLM:
    """Thread-safe, lazily loaded (and on first use built) static embedder; `embed` is cheap enough for the
    event loop."""

    dim = DIM

    def __init__(self, *, model_dir: Path | None = None) -> None:
        self._model_dir = model_dir
        self._table: np.ndarray | None = None
        self._tokenizer: Any | None = None
        self._lock = threading.Lock()
        self._chunks: dict[str, list[int]] = {}

    def load(self) -> None:
        """Load the table (building it first when missing: seconds) and the tokenizer. Blocking."""
        with self._lock:
            if self._table is not None:
                return
            from fleetgate.core.minilm_onnx import minilm_tokenizer

            folder = self._model_dir or minilm_dir()
            table = np.load(build(folder)).astype(np.float32)
            self._tokenizer, self._table = minilm_tokenizer(folder), table

    @property
    def loaded(self) -> bool:
        return self._table is not None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), DIM), rows L2-normalised (a text with no token: zeros)."""
        if self._table is None:
            self.load()
        assert self._table is not None and self._tokenizer is not None
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = self.token_ids(text)
            if ids:  # the sum normalised is the mean normalised
                vector = self._table[ids].sum(axis=0)
                norm = float(np.sqrt(vector @ vector))
                out[row] = vector / norm if norm > 0 else vector
        return out

    def token_ids(self, text: str) -> list[int]:
        """The tokenizer's ids of `text` without special tokens, truncated at 256: the same ids as encoding
        the whole text, assembled from memoised space-separated chunks. Exact because MiniLM's tokenizer
        (BERT normaliser: per character; BERT pre-tokenizer: splits at every space) never lets a token cross
        a space, so the text's tokens are its chunks' tokens in order."""
        if self._tokenizer is None:
            self.load()
        assert self._tokenizer is not None
        memo = self._chunks
        ids: list[int] = []
        for chunk in text.split(" "):
            known = memo.get(chunk)
            if known is None:
                known = self._tokenizer.encode(chunk, add_special_tokens=False).ids if chunk else []
                if len(chunk) <= _MEMO_CHUNK_CHARS:
                    if len(memo) >= _MEMO_ENTRIES:
                        memo.clear()  # hostile streams of new words: start over rather than grow
                    memo[chunk] = known
            ids += known
            if len(ids) >= _MAX_TOKENS:
                return ids[:_MAX_TOKENS]
        return ids


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Distil MiniLM's static token table for the cache's candidate search.")
    parser.add_argument("--model-dir", help="extracted MiniLM folder (default: extracted from the package)")
    args = parser.parse_args(argv)
    print(build(Path(args.model_dir) if args.model_dir else minilm_dir()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
