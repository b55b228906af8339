"""Issue 29 on the real vLLM CPU engine (Gemma 3 270M): `/v1/responses` with the official `openai` client and
`/v1/messages` with the official `anthropic` client, through two gateway replicas on one real Redis.

One engine for the module. A `previous_response_id` follow-up is sent to the other gateway replica: the
conversation is in Redis (`conversations`), the engine gets the full input with `store: false`, so the engine
that answered need not be the one that answers next (the two-engine case runs against fake engines in
`tests/component/test_api_routes.py`; this module keeps to one real engine, as the machine's rules ask). The
ledger must hold exactly the usage the engine reported to the clients, and the budget counter must equal it.
Per input kind, the gateway's prompt bound covers what the engine reads and its exact count (`token_count`,
`chat_views`) equals it. With `server.cancel_finish_tokens`, a streaming client of either API that leaves near
the end lets the engine finish (its own counters say so), and the ledger holds what it generated.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fleetgate.gateway.api_messages import MessagesRoute
from fleetgate.gateway.api_responses import ResponsesRoute
from fleetgate.gateway.conversations import ConversationStore
from fleetgate.gateway.estimate import estimate_body
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.gateway.token_count import tokenize_bodies
from fleetgate.local.config import EngineConfig
from fleetgate.local.engines import EngineFleet, free_port
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.vllm_command import vllm_specs

from .gateway_thread import gateway_in_thread
from .http_json import request_json, tenant_ledger

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

MODEL = "gemma-3-270m"
CONTEXT = 2048
PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}
KEY, KEY_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()
GREEDY = {"temperature": 0}  # sampled, Gemma 3 270M may answer with a stop token alone (no content block)


def tenant_settings(engine_url: str, redis_url: str) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"port": free_port(), "log_requests": False, "auth": "api_key"},
        "models": [{"name": MODEL, "endpoints": [engine_url], "max_model_len": CONTEXT}],
        "redis_url": redis_url,
        "tenancy": {"admin_key_hashes": [ADMIN_HASH], "prices": {MODEL: PRICE}, "tenants": [
            {"id": "acme", "key_hashes": [KEY_HASH], "models": [MODEL], "daily_budget_usd": "1"}]},
    })


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_path = prepare_model()
    logs = tmp_path_factory.mktemp("engine-logs")
    config = EngineConfig(base_port=0, max_model_len=CONTEXT, max_num_seqs=4, log_dir=logs)
    fleet = EngineFleet(specs=vllm_specs(config=config, model_path=model_path), startup_timeout_s=900)
    with fleet:
        fleet.start()
        yield fleet.urls[0]


def ledger(url: str) -> tuple[dict[str, int], int]:
    return tenant_ledger(url, admin=ADMIN, key=KEY)


def test_responses_with_the_openai_client_across_two_replicas(engine_url: str, redis_url: str) -> None:
    import openai

    config = tenant_settings(engine_url, redis_url)
    other = config.model_copy(update={"server": config.server.model_copy(update={"port": free_port()})})
    with gateway_in_thread(config) as url_a, gateway_in_thread(other) as url_b:
        a = openai.OpenAI(base_url=f"{url_a}/v1", api_key=KEY, max_retries=0)
        b = openai.OpenAI(base_url=f"{url_b}/v1", api_key=KEY, max_retries=0)
        # (Gemma 3 270M answers these two with text at temperature 0; some prompts it answers with a stop token.)
        first = a.responses.create(model=MODEL, input="Hello, how are you?", max_output_tokens=12, temperature=0)
        assert first.status in ("completed", "incomplete") and first.output_text, first
        assert first.model == MODEL and first.usage is not None

        # The follow-up through the other replica, streamed: it knows the first response (Redis) and the engine
        # reads the whole conversation, so it reads more than the first request did.
        events = list(b.responses.create(model=MODEL, input="The capital of France is",
                                         instructions="Answer briefly.", previous_response_id=first.id,
                                         max_output_tokens=12, temperature=0, stream=True))
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
        assert "response.output_text.delta" in kinds
        second = events[-1].response  # type: ignore[union-attr]
        assert second.usage is not None and second.previous_response_id == first.id
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens

        # `store: false`: answered, and no follow-up can name it.
        unstored = a.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, store=False, temperature=0)
        with pytest.raises(openai.NotFoundError):
            b.responses.create(model=MODEL, input="again", previous_response_id=unstored.id, max_output_tokens=4)
        assert unstored.usage is not None

        totals, used = ledger(url_a)
    reported = [first.usage, second.usage, unstored.usage]
    assert totals["prompt_tokens"] == sum(u.input_tokens for u in reported), totals
    assert totals["completion_tokens"] == sum(u.output_tokens for u in reported), totals
    assert totals["cost_micros"] == used == sum(u.input_tokens + 2 * u.output_tokens for u in reported)


def test_messages_with_the_anthropic_client(engine_url: str, redis_url: str) -> None:
    import anthropic

    with gateway_in_thread(tenant_settings(engine_url, redis_url)) as url:
        client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)  # sent as x-api-key
        answer = client.messages.create(model=MODEL, max_tokens=12, system="Answer briefly.", extra_body=GREEDY,
                                        messages=[{"role": "user", "content": "Hello, how are you?"}])
        assert answer.type == "message" and answer.role == "assistant" and answer.model == MODEL
        assert answer.content and answer.content[0].type == "text" and answer.content[0].text  # type: ignore[union-attr]

        with client.messages.stream(model=MODEL, max_tokens=12, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": "The capital of France is"}]) as stream:
            kinds = [e.type for e in stream]
            streamed = stream.get_final_message()
        assert kinds[0] == "message_start" and "content_block_delta" in kinds and kinds[-1] == "message_stop"
        assert streamed.usage.output_tokens > 0

        # A model outside the tenant's list: refused by the gateway in Anthropic's error shape.
        with pytest.raises(anthropic.PermissionDeniedError) as refused:
            client.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        assert refused.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
            "type": "permission_error", "message": "tenant 'acme' may not use model 'no-such-model'"}}

        totals, used = ledger(url)
    reported = [answer.usage, streamed.usage]
    assert totals["prompt_tokens"] == sum(u.input_tokens for u in reported), totals
    assert totals["completion_tokens"] == sum(u.output_tokens for u in reported), totals
    assert totals["cost_micros"] == used == sum(u.input_tokens + 2 * u.output_tokens for u in reported)


ASSISTANT = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Hi, I am here to help you.", "annotations": []}]}
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "input string": ("responses", {"input": "The capital of France is"}),
    "instructions": ("responses", {"input": "The capital of France is", "instructions": "Answer in one word."}),
    "stored conversation": ("responses", {"instructions": "Be brief.", "input": [
        {"role": "user", "content": "Hello, how are you?"}, ASSISTANT,
        {"role": "user", "content": "The capital of France is"}]}),
    "text parts": ("responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "one two three"}, {"type": "input_text", "text": "four five six"}]}]}),
    "tool call and output": ("responses", {"input": [
        {"role": "user", "content": "look up x"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "x y z"}', "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "the answer is forty two"}]}),
    "tools": ("responses", {"input": "hi", "tool_choice": "none", "tools": [{
        "type": "function", "name": "lookup", "description": "look things up in the big database",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]}),
    "messages": ("messages", {"system": "Answer briefly.", "messages": [
        {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "The capital of France is"}]}]}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_bound_and_the_exact_count_against_what_the_engine_reads(engine_url: str, kind: str) -> None:
    api, extra = KINDS[kind]
    limit = {"max_output_tokens": 1, "store": False} if api == "responses" else {"max_tokens": 1}
    body = {"model": MODEL, "temperature": 0, **limit, **extra}
    status, answer = request_json(f"{engine_url}/v1/{api}", body)
    assert status == 200, answer
    read = answer["usage"]["input_tokens"]
    route = ResponsesRoute(store=ConversationStore.__new__(ConversationStore)) if api == "responses" \
        else MessagesRoute()
    shape = route.reserve_shape(route.parse(orjson.dumps(body), {}))
    assert estimate_body(shape.body, prompts_field=None, context=CONTEXT).prompt_tokens >= read, kind
    [request], margin = tokenize_bodies(api, body, served=MODEL)  # type: ignore[arg-type]
    status, counted = request_json(f"{engine_url}{'/tokenize' if api == 'responses' else '/v1/messages/count_tokens'}",
                                   request)
    assert status == 200, counted
    assert counted.get("count", counted.get("input_tokens")) == read, (kind, counted, read)
    assert margin <= 8  # `tool_choice`'s bytes, which /tokenize cannot take


def engine_counts(engine_url: str) -> tuple[float, float]:
    """(tokens generated, requests finished) by the engine's own counters (an aborted request is not counted as
    finished)."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    return (sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:generation_tokens_total")),
            sum(float(line.rsplit(" ", 1)[1]) for line in lines
                if line.startswith("vllm:request_success_total")))


LONG = "Count from 1 to 200, separating the numbers with commas."
# A streamed request of 24 tokens (the Responses one all of them: `ignore_eos`, which vLLM's Messages API does not
# take), and what its output deltas hold.
LEAVING: dict[str, tuple[dict[str, Any], bytes]] = {
    "responses": ({"input": LONG, "max_output_tokens": 24, "store": False, "ignore_eos": True},
                  b'"type":"response.output_text.delta"'),
    "messages": ({"messages": [{"role": "user", "content": LONG}], "max_tokens": 24}, b'"type":"content_block_delta"'),
}


@pytest.mark.parametrize("api", list(LEAVING))
def test_a_client_leaving_near_the_end_lets_the_real_engine_finish_and_is_charged_its_count(
    engine_url: str, redis_url: str, api: str
) -> None:
    """`server.cancel_finish_tokens` on the Responses and Messages APIs: the client leaves after 3 output deltas of
    24 reserved tokens (21 to come, within 64), so the engine is not aborted; it finishes for nobody and the
    tenant is charged exactly what the engine's own counter says it generated (its final usage, which the client
    never saw)."""
    config = tenant_settings(engine_url, redis_url)
    config = config.model_copy(update={"server": config.server.model_copy(update={"cancel_finish_tokens": 64})})
    extra, delta = LEAVING[api]
    body = {"model": MODEL, "temperature": 0, "stream": True, **extra}
    with gateway_in_thread(config) as url:
        totals_before, _ = ledger(url)
        generated_before, finished_before = engine_counts(engine_url)
        req = urllib.request.Request(f"{url}/v1/{api}", data=orjson.dumps(body), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        got = 0
        with urllib.request.urlopen(req, timeout=300) as response:
            for line in response:
                got += line.startswith(b"data: {") and delta in line.replace(b'": "', b'":"')
                if got == 3:
                    break  # leaving the `with` closes the connection mid-stream
        assert got == 3
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the engine finishes; then the gateway settles and records
            totals, _ = ledger(url)
            if totals["requests"] > totals_before["requests"]:
                break
        generated, finished = engine_counts(engine_url)
    assert finished == finished_before + 1, (generated - generated_before)  # the engine finished: not aborted
    assert 3 < generated - generated_before <= 24 and (api == "messages" or generated - generated_before == 24)
    assert totals["completion_tokens"] - totals_before["completion_tokens"] == generated - generated_before
