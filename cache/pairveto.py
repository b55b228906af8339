"""The pair veto: a MiniLM cross-encoder asked about the pairs the pair model accepts (issue 30, round 6).

The pair model (`fleetgate.cache.verifier`) reads features of the difference between two prompts and cannot
see an added constraint ("a story about X" / "... told only in dialogue") when the rest is a paraphrase. This
model reads both prompts at once, "[CLS] a [SEP] b [SEP]" (a, b in sorted order, so it is symmetric; at most
96 tokens), with the packaged MiniLM plus rank-8 adapters on every linear map of its six layers and a logistic
head on the [CLS] and masked-mean states, fine-tuned on the development rows
(`scripts/crossencoder/gpu_finetune.py --save-adapters`; the adapters and head, float16, 0.66 MB:
`data/pair_veto_lora8.safetensors`, whose metadata holds the recipe and the rows' sha256). At first use the
adapters are merged into the installed MiniLM and the result is exported and quantised as the cache's int8
embedder is (`fleetgate.core.minilm_export.ensure_pair_veto`, a child process, once per model folder), then
run by ONNX Runtime on one thread: 3.8-4.2 ms more CPU per would-be hit at p50 (`scripts/crossencoder/lookup_cost.py`).

`TwoLayerCache` asks it only for a would-be hit (the pair model's acceptance; not a pair settled by the word
match, not a miss), so misses never pay for it, and loads it on the first would-be hit. A scorer that fails
to load stays failed (no export retried per lookup) and logs once; the cache then answers those lookups as
misses, never with an unvetted hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from fleetgate.cache.metrics import CacheMetrics

ADAPTERS = Path(__file__).resolve().parent / "data" / "pair_veto_lora8.safetensors"
MAX_TOKENS = 96  # as trained

log = logging.getLogger("fleetgate.cache")


class PairScorer(Protocol):
    def load(self) -> None:
        """Load now (blocking); raises when it cannot."""
        ...

    def probability(self, a: str, b: str) -> float:
        """The probability that one answer serves both prompts (blocking; symmetric in a and b)."""
        ...


class OnnxPairScorer:
    """The shipped cross-encoder on ONNX Runtime (int8), lazily loaded; thread-safe. A load that failed is not
    retried: every later call raises the same error at once (the first failure is logged)."""

    def __init__(self, *, model_dir: Path | None = None, adapters: Path = ADAPTERS, threads: int = 1) -> None:
        self.model_dir = model_dir
        self.adapters = adapters
        self._threads = threads
        self._loaded: tuple[Any, Any] | None = None  # (tokenizer, session)
        self._error: Exception | None = None
        self._lock = threading.Lock()
        self.runs = 0

    def load(self) -> None:
        self._session()

    def _session(self) -> tuple[Any, Any]:
        with self._lock:
            if self._loaded is not None:
                return self._loaded
            if self._error is not None:
                raise self._error
            try:
                from fleetgate.core.minilm import minilm_dir
                from fleetgate.core.minilm_export import ensure_pair_veto
                from fleetgate.core.minilm_onnx import cpu_session, minilm_tokenizer

                if not self.adapters.is_file():
                    raise FileNotFoundError(f"the pair veto's adapters are missing: {self.adapters}")
                folder = self.model_dir or minilm_dir()
                tokenizer = minilm_tokenizer(folder)  # a fresh instance: its truncation is the veto's own
                tokenizer.enable_truncation(max_length=MAX_TOKENS)
                session = cpu_session(str(ensure_pair_veto(model_dir=folder, adapters=self.adapters)),
                                      threads=self._threads)
            except Exception as exc:
                self._error = exc
                log.error("semantic cache: the pair veto did not load (%s); would-be semantic hits are served as "
                          "misses until it does (restart), or set semantic.pair_veto.enabled: false", exc)
                raise
            self._loaded = (tokenizer, session)
            return self._loaded

    def probability(self, a: str, b: str) -> float:
        tokenizer, session = self._session()
        enc = tokenizer.encode(*sorted((a, b)))
        n = len(enc.ids)
        self.runs += 1
        (logit,) = session.run(["logit"], {"input_ids": np.array([enc.ids], dtype=np.int64),
                                           "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
                                           "attention_mask": np.ones((1, n), dtype=np.int64)})
        return 1.0 / (1.0 + math.exp(-float(logit[0])))


@lru_cache(maxsize=4)
def default_scorer(model_dir: Path | None = None) -> OnnxPairScorer:
    """One scorer per model folder and process: the evaluation builds a cache per row, a gateway one."""
    return OnnxPairScorer(model_dir=model_dir)


class PairVeto:
    """The veto as a lookup uses it: the scorer, its threshold, its one background load and its metrics."""

    def __init__(self, scorer: PairScorer, *, threshold: float, metrics: CacheMetrics) -> None:
        self.scorer = scorer
        self.threshold = threshold
        self.metrics = metrics
        self.loading: asyncio.Task[None] | None = None

    def preload(self) -> None:
        """Load now, blocking (`semantic.preload`, in the cache's warm-up thread); a failure is logged by the scorer
        and fails safe on lookups."""
        with contextlib.suppress(Exception):
            self.scorer.load()

    async def judge(self, cached: str, text: str, *, background: bool) -> tuple[str | None, bool]:
        """On a would-be hit: (None, _) when it passes; (why, True) when it refuses (the next candidate may still
        be served); (why, False) when it cannot answer (loading, with `background`, a serving cache, so no request
        waits seconds for it; or failed to load or to score): the lookup is a miss, never an unvetted hit. Offline
        callers (evaluation, benchmarks) wait for the load."""
        if self.loading is None:
            self.loading = asyncio.create_task(asyncio.to_thread(self.scorer.load), name="cache-veto-load")
        if not self.loading.done():
            if background:
                self.metrics.at(self.metrics.rejections, "pair_veto_unavailable").inc()
                return "pair veto warming up", False
            await asyncio.wait([self.loading])  # never raises
        t = time.perf_counter()
        try:
            self.loading.result()  # a failed load raises here (logged once by the scorer)
            p = await asyncio.to_thread(self.scorer.probability, cached, text)
        except Exception as exc:
            self.metrics.at(self.metrics.rejections, "pair_veto_unavailable").inc()
            log.debug("pair veto unavailable: %s", exc)
            return "pair veto unavailable", False
        finally:
            self.metrics.at(self.metrics.stage_seconds, "veto").observe(time.perf_counter() - t)
        if p < self.threshold:
            self.metrics.at(self.metrics.rejections, "pair_veto").inc()
            return f"near miss rejected (pair_veto, p={p:.3f})", True
        return None, True
