"""A stand-in encoder service: `POST /v1/embeddings` on loopback, for tests and the gateway benchmark.

What the gateway's remote encoder (`fleetgate.cache.remote_encoder`) sends is MiniLM token ids; this server
answers with MiniLM's float32 vectors of them, as a vLLM pooling engine serving all-MiniLM-L6-v2 in float32
would (to 1e-6), from `MiniLMVectors`: a table of precomputed vectors keyed by token ids (built once, on
first use, for every question of `bench gateway`'s varied workload), and for ids not in it the fp32 ONNX
graph run in this process. Answering from a table costs microseconds, so the server stands in for a GPU
encoder when what is measured is the gateway's CPU (an H100 encodes a batch in about a millisecond; here the
benchmark's other core would take 2-5 ms a text and be the bottleneck; a vector computed once is kept too).
The vectors are the ones a real
service gives, so the gateway's candidates, verifications and token-state passes are the real ones.

Faults, for the permanent tests: `mode` `stall` (accepts the request and never answers), `error` (HTTP 500),
`garbage` (HTTP 200 with rows that are not unit vectors of the right size), `other-model` (well-formed
unit vectors of another model: the canary check must refuse them). `delay_ms` adds a fixed service time.

`python -m fleetgate.bench.encoder_stub --port P [--mode M] [--delay-ms D] [--no-table]` runs it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import orjson
from aiohttp import web

from fleetgate.core.localredis import free_port

Vectors = Callable[[Sequence[Sequence[int]]], np.ndarray]
MODES = ("ok", "stall", "error", "garbage", "other-model")
VARIED_COUNT = 76_800  # `fleetgate.bench.loadgen.varied_prompt`'s distinct questions
_MAX_KNOWN = 200_000  # vectors kept: the table and what was computed since


STATE = web.AppKey("state", dict)  # the app's request and text counts (tests)


def table_path(model_dir: Path) -> Path:
    return model_dir / "bench-varied-fp32.npz"


class MiniLMVectors:
    """MiniLM float32 vectors of token-id sequences: a table where one was built, the ONNX graph otherwise."""

    def __init__(self, *, model_dir: Path | None = None, table: bool = True) -> None:
        from fleetgate.core.minilm import minilm_dir
        from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder

        self.model_dir = model_dir or minilm_dir()
        self.encoder = OnnxMiniLMEmbedder(model_dir=self.model_dir, variant="fp32", intra_op_threads=1)
        self.known: dict[bytes, np.ndarray] = {}
        self.computed = 0  # texts the table did not hold (tests, diagnostics)
        if table:
            self._load_table()

    @staticmethod
    def key(ids: Sequence[int]) -> bytes:
        return np.asarray(ids, dtype=np.int32).tobytes()

    def _load_table(self) -> None:
        path = table_path(self.model_dir)
        if path.is_file():
            data = np.load(path)
            for ids, length, vector in zip(data["ids"], data["lengths"], data["vectors"], strict=True):
                self.known[self.key(ids[:length])] = vector.astype(np.float32)

    def __call__(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.empty((len(batch), self.encoder.dim), dtype=np.float32)
        todo = []
        for row, ids in enumerate(batch):
            found = self.known.get(self.key(ids))
            if found is None:
                todo.append(row)
            else:
                out[row] = found
        for row in todo:  # one at a time: unpadded, as a service runs each sequence
            one = np.asarray([batch[row]], dtype=np.int64)
            out[row] = self.encoder.run(one, np.ones_like(one))[0]
            self.computed += 1
            if len(self.known) < _MAX_KNOWN:  # a text asked again (a repeated paraphrase) is answered at once
                self.known[self.key(batch[row])] = out[row].copy()
        return out


def build_varied_table(*, model_dir: Path | None = None, progress: Callable[[str], None] = print) -> Path:
    """Precompute MiniLM float32 vectors of every varied-workload question, as the gateway sends them
    (`embedding_text`, then MiniLM's ids), into the model folder (minutes, once)."""
    from fleetgate.bench.loadgen import varied_prompt
    from fleetgate.cache.textnorm import embedding_text
    from fleetgate.core.minilm import minilm_dir
    from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder, minilm_tokenizer

    folder = model_dir or minilm_dir()
    path = table_path(folder)
    if path.is_file():
        return path
    tokenizer = minilm_tokenizer(folder)
    encoder = OnnxMiniLMEmbedder(model_dir=folder, variant="fp32", intra_op_threads=None)
    texts = [embedding_text(varied_prompt(n)) for n in range(VARIED_COUNT)]
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    width = max(map(len, ids))
    padded = np.zeros((len(ids), width), dtype=np.int32)
    for row, seq in enumerate(ids):
        padded[row, : len(seq)] = seq
    vectors = np.empty((len(texts), encoder.dim), dtype=np.float32)
    step = 512
    for start in range(0, len(texts), step):
        vectors[start : start + step] = encoder.embed(texts[start : start + step])
        if (start // step) % 20 == 0:
            progress(f"  encoder stub: {start + step}/{len(texts)} varied questions encoded")
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ids=padded, lengths=np.array(list(map(len, ids)), dtype=np.int32), vectors=vectors)
    tmp.replace(path)
    return path


def _answer(vectors: np.ndarray, *, model: str, tokens: int, as_base64: bool) -> bytes:
    rows = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()}
            for i, v in enumerate(vectors)]
    return orjson.dumps({"object": "list", "model": model, "data": rows,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def encoder_app(*, vectors: Vectors | None, mode: str = "ok", delay_ms: float = 0.0, model: str = "all-minilm-l6-v2",
                dim: int = 384) -> web.Application:
    """The aiohttp application; `vectors` answers mode `ok` (None: only the fault modes)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    state = {"requests": 0, "texts": 0}
    rng = np.random.default_rng(1)

    async def embeddings(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        batch = body["input"]
        state["requests"] += 1
        state["texts"] += len(batch)
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if mode == "stall":
            await asyncio.sleep(3600)
        if mode == "error":
            return web.json_response({"error": {"message": "engine dead", "type": "InternalServerError"}}, status=500)
        if mode == "garbage":
            rows = rng.standard_normal((len(batch), dim // 2)).astype(np.float32)  # half the size, not unit
            return web.Response(body=_answer(rows, model=model, tokens=0, as_base64=True),
                                content_type="application/json")
        if mode == "other-model":
            rows = rng.standard_normal((len(batch), dim)).astype(np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        else:
            assert vectors is not None
            rows = vectors(batch)
        tokens = sum(len(ids) for ids in batch)
        return web.Response(body=_answer(rows, model=model, tokens=tokens,
                                         as_base64=body.get("encoding_format") == "base64"),
                            content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    app = web.Application(client_max_size=64 << 20)
    app[STATE] = state
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


@asynccontextmanager
async def serving(app: web.Application, *, port: int = 0) -> AsyncIterator[str]:
    """`app` on loopback inside the running loop (tests, benchmarks); yields its base URL."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = port or free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A loopback stand-in for an encoder service (MiniLM fp32).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--no-table", action="store_true", help="compute every vector (no precomputed table)")
    args = parser.parse_args(argv)
    vectors = MiniLMVectors(table=not args.no_table) if args.mode == "ok" else None
    web.run_app(encoder_app(vectors=vectors, mode=args.mode, delay_ms=args.delay_ms), host="127.0.0.1",
                port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
