"""`RemoteEncoder`: MiniLM served by an encoder service, for `semantic.embedder: remote`.

The service is an OpenAI-compatible `POST /v1/embeddings` endpoint: vLLM's pooling runner serving
all-MiniLM-L6-v2 in float32 (an InferenceService with `engine.task: embed`, or `fleetgate up --embedder
engine`). The gateway keeps what is cheap (the tokenizer, the static prefilter, the verifier) and sends the
encoder only the prompts that need it, batched by `fleetgate.core.embed_batcher.BatchingEmbedder`, which calls
`aencode` with up to `batch_max` texts, at most `max_in_flight` requests at once.

Request. The texts go as MiniLM's own token ids (`tokenizers`, truncated at 256 with [CLS] and [SEP], as the
in-process encoders run them), not as text: the service then encodes exactly the tokens the in-process
encoder would, whatever its own tokenizer settings or truncation (vLLM refuses a text longer than the
model's 256 positions unless told to truncate, and truncation sides differ between releases), and spends no
CPU tokenising. Vectors come back as base64 float32 (`encoding_format: base64`: 2 kB a text, decoded with
no float parsing).

An answer is checked before any lookup uses it: one row per text, 384 finite values each, unit length
(1e-3); anything else is `garbage`. The first answer of the service, and the first after an outage, also
carries a canary text whose vector must be MiniLM's (cosine >= `IDENTITY_MIN` with the vector shipped in
`cache/data/minilm_canary.json`, computed from the packaged weights in float32): a service that serves
another model is refused (`identity`), whatever its dimension. Below `EXACT_MIN` a warning says the service
does not run MiniLM in float32 (bf16/fp16 move cosines by ~1e-3, enough to change decisions on pairs that
sit that close to a threshold).

Failures never reach a request: every error raises `EncoderUnavailable(reason)` and the cache goes on
without the encoder. A circuit breaker (`failures_to_open` failed requests in a row) then answers
`circuit_open` at once, so a dead or stalled service costs each lookup nothing; one request probes it again
every `retry_after_s`.

`embed(texts)` is the blocking twin for offline callers (`fleetgate cache-eval`, answer checks): the same
request over `urllib`, in batches, with a generous timeout and no breaker.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetgate.cache.config import RemoteEncoderConfig
from fleetgate.cache.metrics import EncoderMetrics
from fleetgate.core.minilm import MINILM_DIM

log = logging.getLogger("fleetgate.cache")

CANARY_FILE = Path(__file__).with_name("data") / "minilm_canary.json"
IDENTITY_MIN = 0.999  # below: not MiniLM (another model; bge-small, e5-small are 384-wide too)
EXACT_MIN = 0.99999  # below: MiniLM, but not in float32 (measured: vLLM CPU float32 vs the canary 1 - 1e-7)
_NORM_TOLERANCE = 1e-3
_OFFLINE_TIMEOUT_S = 60.0


class EncoderUnavailable(Exception):
    """The encoder could not give a vector in time; `reason` labels the fallback metric."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"encoder unavailable ({reason}){': ' + detail if detail else ''}")
        self.reason = reason


class Breaker:
    """Closed: every request goes. Open (after `failures` failed requests in a row): none goes until
    `retry_after_s` has passed; then exactly one probes, and its result closes or reopens the circuit."""

    def __init__(self, *, failures: int, retry_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = failures
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._failed = 0
        self._open_until: float | None = None
        self._probing = False

    @property
    def closed(self) -> bool:
        return self._open_until is None

    def admit(self) -> bool:
        if self._open_until is None:
            return True
        if self._probing or self._clock() < self._open_until:
            return False
        self._probing = True
        return True

    def succeeded(self) -> None:
        self._failed, self._open_until, self._probing = 0, None, False

    def failed(self) -> None:
        self._failed += 1
        if self._probing or self._failed >= self._limit:
            self._open_until = self._clock() + self._retry_after_s
        self._probing = False


def load_canary(path: Path = CANARY_FILE) -> tuple[str, np.ndarray]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return str(data["text"]), np.asarray(data["vector"], dtype=np.float32)


def parse_vectors(raw: bytes, *, count: int, dim: int = MINILM_DIM) -> np.ndarray:
    """The (count, dim) float32 rows of an embeddings answer, in input order; `EncoderUnavailable("garbage")`
    for anything that is not exactly that (base64 float32 or a float list per row, unit length)."""
    try:
        body = orjson.loads(raw)
        data = sorted(body["data"], key=lambda item: int(item["index"]))
        rows = [_row(item["embedding"]) for item in data]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise EncoderUnavailable("garbage", f"unreadable answer: {exc!s:.200}") from None
    if len(rows) != count or any(r.shape != (dim,) for r in rows):
        raise EncoderUnavailable("garbage", f"{len(rows)} rows of {[r.shape for r in rows[:3]]}, "
                                            f"expected {count} of ({dim},)")
    out = np.stack(rows) if rows else np.zeros((0, dim), dtype=np.float32)
    norms = np.linalg.norm(out, axis=1)
    if not np.isfinite(out).all() or (np.abs(norms - 1.0) > _NORM_TOLERANCE).any():
        raise EncoderUnavailable("garbage", "rows are not finite unit vectors")
    return out


def _row(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    if isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return np.asarray(value, dtype=np.float32)
    raise TypeError(f"an embedding is {type(value).__name__}")


class RemoteEncoder:
    """MiniLM behind `/v1/embeddings`. `endpoints`: the base URLs to use when `config.url` is unset (discovery);
    requests take them in turn."""

    dim = MINILM_DIM

    def __init__(self, *, config: RemoteEncoderConfig, endpoints: Callable[[], Sequence[str]] | None = None,
                 metrics: EncoderMetrics | None = None, model_dir: Path | None = None) -> None:
        self.config = config
        self.timeout_s = config.timeout_ms / 1000  # a lookup's bound (the batcher's, queueing included)
        # A request gives up a little earlier than its callers, so that a stalled one is counted as failed
        # (breaker) before they go on without it: with an outage, the lookups after `failures_to_open`
        # stalled requests find the circuit open and do not wait at all.
        self._request_timeout_s = 0.9 * self.timeout_s
        self._endpoints = endpoints
        self._metrics = metrics
        self._model_dir = model_dir
        self._tokenizer: Any | None = None
        self._turn = itertools.count()
        self.breaker = Breaker(failures=config.failures_to_open, retry_after_s=config.retry_after_s)
        self._canary: tuple[str, np.ndarray] | None = None
        self._verified = not config.check_identity
        self._session: Any | None = None  # aiohttp.ClientSession of the loop that made it
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0  # requests sent (tests, diagnostics)

    # -- set-up ------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Load the tokenizer and the canary (blocking, milliseconds); no request is sent."""
        if self._tokenizer is None:
            from fleetgate.core.minilm import minilm_dir
            from fleetgate.core.minilm_onnx import minilm_tokenizer

            self._tokenizer = minilm_tokenizer(self._model_dir or minilm_dir())
        if self._canary is None and self.config.check_identity:
            self._canary = load_canary()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tokenizer is None:
            self.load()
        assert self._tokenizer is not None
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def url(self) -> str:
        if self.config.url is not None:
            return self.config.url.rstrip("/")
        urls = list(self._endpoints()) if self._endpoints is not None else []
        if not urls:
            raise EncoderUnavailable("no_endpoint", f"no endpoint serves {self.config.model!r}")
        return urls[next(self._turn) % len(urls)].rstrip("/")

    def _body(self, texts: Sequence[str], *, canary: bool) -> tuple[bytes, int]:
        """The request body and how many rows the answer must hold (the canary's last)."""
        if canary:
            self.load()
            assert self._canary is not None
            texts = [*texts, self._canary[0]]
        body = {"model": self.config.model, "input": self.token_ids(texts), "encoding_format": "base64"}
        return orjson.dumps(body), len(texts)

    def _checked(self, raw: bytes, *, count: int, canary: bool) -> np.ndarray:
        vectors = parse_vectors(raw, count=count)
        if not canary:
            return vectors
        assert self._canary is not None
        cosine = float(vectors[-1] @ self._canary[1])
        if cosine < IDENTITY_MIN:
            raise EncoderUnavailable("identity", f"the service's vector of the canary text has cosine {cosine:.4f} "
                                                 f"with MiniLM's: it does not serve all-MiniLM-L6-v2")
        if cosine < EXACT_MIN:
            log.warning("semantic cache: the encoder service gives MiniLM's vectors to cosine %.6f only (float32 gives "
                        "1 - 1e-7): it runs another precision, and decisions near a threshold may differ from "
                        "in-process MiniLM's", cosine)
        self._verified = True
        return vectors[:-1]

    # -- the gateway's path --------------------------------------------------------------------------------
    async def aencode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) unit rows, or `EncoderUnavailable` within `timeout_ms`."""
        import aiohttp

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        url = self.url()  # no endpoint at all says nothing about the service's health: not the breaker's
        if not self.breaker.admit():
            raise EncoderUnavailable("circuit_open")
        started = time.perf_counter()
        canary = not self._verified
        try:
            body, count = self._body(texts, canary=canary)
            self.requests += 1
            session = self._session_now()
            async with session.post(url + "/v1/embeddings", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                raw = await response.read()
                if response.status != 200:
                    raise EncoderUnavailable("error", f"HTTP {response.status}: {raw[:200]!r}")
            vectors = self._checked(raw, count=count, canary=canary)
        except EncoderUnavailable as exc:
            self._failed(exc.reason, started, str(exc))
            raise
        except TimeoutError as exc:
            self._failed("timeout", started, f"no answer within {self._request_timeout_s * 1000:g} ms")
            raise EncoderUnavailable("timeout", f"no answer within {self.config.timeout_ms:g} ms") from exc
        except (aiohttp.ClientError, OSError) as exc:
            self._failed("error", started, f"{type(exc).__name__}: {exc!s:.200}")
            raise EncoderUnavailable("error", f"{type(exc).__name__}: {exc!s:.200}") from exc
        if not self.breaker.closed:
            log.warning("semantic cache: the encoder service answers again (%s); lookups use it", url)
        self.breaker.succeeded()
        if self._metrics is not None:
            self._metrics.observe(result="ok", seconds=time.perf_counter() - started, texts=len(texts),
                                  up=True)
        return vectors

    def _failed(self, reason: str, started: float, detail: str = "") -> None:
        was_closed = self.breaker.closed
        self.breaker.failed()
        self._verified = not self.config.check_identity  # after an outage, the service is checked again
        if reason == "identity":  # a misconfiguration, not an outage: said every time it is probed
            log.error("semantic cache: %s; lookups go on without the encoder", detail)
        elif was_closed and not self.breaker.closed:
            log.warning("semantic cache: the encoder service failed %d times in a row (last: %s %s); lookups go on "
                        "without it, probing it every %g s", self.config.failures_to_open, reason, detail,
                        self.config.retry_after_s)
        if self._metrics is not None:
            self._metrics.observe(result=reason, seconds=time.perf_counter() - started, texts=0,
                                  up=self.breaker.closed)

    def _session_now(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2 * self.config.max_in_flight),
                timeout=aiohttp.ClientTimeout(total=self._request_timeout_s),
            )
            self._session_loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed and self._session_loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    # -- offline callers ------------------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking: every text's vector, `batch_max` texts per request; raises `EncoderUnavailable`."""
        out = [np.zeros((0, self.dim), dtype=np.float32)]
        step = self.config.batch_max
        for start in range(0, len(texts), step):
            canary = not self._verified
            body, count = self._body(texts[start:start + step], canary=canary)
            request = urllib.request.Request(self.url() + "/v1/embeddings", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=max(self.timeout_s, _OFFLINE_TIMEOUT_S)) as response:
                    raw = response.read()
            except (urllib.error.URLError, OSError) as exc:
                raise EncoderUnavailable("error", f"{type(exc).__name__}: {exc!s:.200}") from exc
            out.append(self._checked(raw, count=count, canary=canary))
        return np.concatenate(out)
