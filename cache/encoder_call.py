"""One call to the cache's encoder, whatever it is, with every failure turned into `EncoderUnavailable`.

In-process embedders answer in a worker thread (or through a `BatchingEmbedder`'s `aembed`, which batches
concurrent lookups); the remote encoder service raises `EncoderUnavailable` itself. Any other exception or
a timeout becomes one too, so the semantic layer has one thing to catch and a lookup never fails a request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from fleetgate.cache.embedding import Embedder
from fleetgate.cache.remote_encoder import EncoderUnavailable


async def encode(embedder: Embedder, text: str, *, scope: str, observe: Callable[[float], None]) -> np.ndarray:
    """`text`'s vector (already spelling-corrected); `observe` gets the seconds taken, failed calls included.
    `scope`: the partition, which keeps a batcher's memo per tenant."""
    start = time.perf_counter()
    aembed = getattr(embedder, "aembed", None)
    try:
        if aembed is not None:
            vector: np.ndarray = await aembed(text, scope=scope)
        else:
            vector = (await asyncio.to_thread(embedder.embed, [text]))[0]
    except EncoderUnavailable:
        raise
    except TimeoutError as exc:
        raise EncoderUnavailable("timeout") from exc
    except Exception as exc:
        raise EncoderUnavailable("error", f"{type(exc).__name__}: {exc}") from exc
    finally:
        observe(time.perf_counter() - start)
    return vector
