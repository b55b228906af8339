"""Issue 29's `/v1/embeddings` on a real engine: the cache's encoder (all-MiniLM-L6-v2, float32) as a vLLM CPU
pooling engine (the one `fleetgate up --embedder engine` starts), behind a gateway with api_key auth, one tenant
with a budget and a real Redis, driven with the official `openai` client.

One engine for the module. The gateway's vectors must be the engine's own for the same input (the gateway
forwards, it never re-embeds), the tenant must be charged exactly the `usage.prompt_tokens` the engine reports
(the input rate is 1 USD per 1M tokens, so one micro-dollar a token), and chat on the embedding model must be
refused with an OpenAI-shaped 400 that charges nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest

from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.local.encoder_config import ENCODER_MODEL, EncoderEngineConfig
from fleetgate.local.encoder_engine import EncoderEngine
from fleetgate.local.engines import free_port

from .gateway_thread import gateway_in_thread
from .http_json import request_json, tenant_ledger

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

DIMENSIONS = 384  # all-MiniLM-L6-v2's hidden size
PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}
KEY, KEY_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()
ONE = "How do I check if a file exists in Python?"
MANY = ["The cat sat on the mat.", "Kubernetes schedules pods onto nodes.", "Paris is the capital of France, "
        "a city on the Seine known for its museums, cafés and long history."]


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = EncoderEngineConfig(log_dir=tmp_path_factory.mktemp("encoder-logs"), startup_timeout_s=900)
    engine = EncoderEngine(config, progress=lambda line: None)
    try:
        engine.launch()
        engine.wait()
        yield engine.url
    finally:
        engine.stop()


def tenant_settings(engine_url: str, redis_url: str) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"port": free_port(), "log_requests": False, "auth": "api_key"},
        "models": [{"name": ENCODER_MODEL, "endpoints": [engine_url], "task": "embed"}],
        "redis_url": redis_url,
        "tenancy": {"admin_key_hashes": [ADMIN_HASH], "prices": {ENCODER_MODEL: PRICE}, "tenants": [
            {"id": "acme", "key_hashes": [KEY_HASH], "models": [ENCODER_MODEL], "daily_budget_usd": "1"}]},
    })


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


def engine_answer(engine_url: str, text: str | list[str]) -> tuple[list[list[float]], int]:
    """The engine's own vectors and `usage.prompt_tokens` for the input, called directly."""
    status, answer = request_json(f"{engine_url}/v1/embeddings", {"model": ENCODER_MODEL, "input": text})
    assert status == 200, answer
    return [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])], \
        answer["usage"]["prompt_tokens"]


def test_embeddings_through_the_gateway_are_the_engines_and_charged_as_it_reports(
    engine_url: str, redis_url: str
) -> None:
    import openai

    with gateway_in_thread(tenant_settings(engine_url, redis_url)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        single = client.embeddings.create(model=ENCODER_MODEL, input=ONE)
        batch = client.embeddings.create(model=ENCODER_MODEL, input=MANY)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=ENCODER_MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
        totals, used = tenant_ledger(url, admin=ADMIN, key=KEY)

    expected_one, tokens_one = engine_answer(engine_url, ONE)
    expected_many, tokens_many = engine_answer(engine_url, MANY)
    assert single.model == batch.model == ENCODER_MODEL
    assert [d.index for d in single.data] == [0] and [d.index for d in batch.data] == [0, 1, 2]
    for got, expected in zip([single.data[0], *batch.data], [*expected_one, *expected_many], strict=True):
        assert len(got.embedding) == DIMENSIONS
        assert cosine(got.embedding, expected) > 0.9999
    # The engine counts each input's tokens ([CLS] ... [SEP]); the batch reads more than any one of its inputs.
    assert single.usage.prompt_tokens == tokens_one and batch.usage.prompt_tokens == tokens_many
    assert tokens_many > max(engine_answer(engine_url, text)[1] for text in MANY)

    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "model" and "embedding model" in error["message"], error
    assert refused.value.status_code == 400

    # The refused chat is on the ledger as an error (as every refusal after authentication is) and costs nothing.
    assert totals["requests"] == 3 and totals["errors"] == 1 and totals["completion_tokens"] == 0, totals
    assert totals["prompt_tokens"] == tokens_one + tokens_many, totals
    assert totals["cost_micros"] == used == tokens_one + tokens_many, (totals, used)
