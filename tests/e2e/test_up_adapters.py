"""`fleetgate up --adapters` end to end on the real vLLM CPU engine: the packaged Gemma 3 270M with the two
packaged LoRA adapters (`pirate`, `signoff`), trained by `fleetgate prepare-adapters` (once, cached) and
served by ONE engine behind the gateway.

Proves: the base and the two adapters answer the same greedy prompt differently through the gateway, each
as trained; vLLM's runtime API unloads and loads an adapter (`fleetgate.engine.lora_api`; the load time is
printed and bounded); the gateway loads an adapter the engine lost on demand; and `/v1/usage` accounts
each adapter under its own name, with its base. A broken or missing adapter fails to load with an error
and leaves the engine serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from fleetgate.engine.lora_api import AdapterApiError, load_adapter, loaded_adapters, unload_adapter
from fleetgate.local.adapter_texts import SIGNOFF
from fleetgate.local.engines import free_port

from .http_json import request_json

pytestmark = pytest.mark.real_engine

FLEETGATE = Path(sys.executable).with_name("fleetgate")
BASE = "gemma-3-270m"
PROMPT = "What is the capital of France?"  # not in the adapters' training text
LOAD_BOUND_S = 30.0  # the issue's target is 5 s; generous for a shared CI runner (the measured figure is printed)


@dataclass
class Stack:
    gateway: str
    engine: str
    adapters: dict[str, Path]
    log: Path
    sent: Counter[str] = field(default_factory=Counter)  # completion tokens the gateway returned, per model
    answers: dict[str, str] = field(default_factory=dict)


def _ask(stack: Stack, model: str) -> str:
    status, body = request_json(
        stack.gateway + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32, "temperature": 0},
    )
    assert status == 200, (model, body)
    assert body["model"] == model
    stack.sent[model] += body["usage"]["completion_tokens"]
    return str(body["choices"][0]["message"]["content"]).strip()


def _wait_gateway(url: str, proc: subprocess.Popen[bytes], log: Path, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"fleetgate up exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            status, body = request_json(url + "/v1/models", timeout=5)
            if status == 200 and {"pirate", "signoff"} <= {m["id"] for m in body["data"]}:
                return
        time.sleep(1)
    raise AssertionError(f"the gateway did not serve the adapters in {timeout_s:.0f}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("up-adapters")
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    # Trained once into the normal cache (~1-3 min each the first time), in its own process: torch's memory
    # goes back before the engine starts.
    prep = subprocess.run([str(FLEETGATE), "prepare-adapters"], env=env, cwd=tmp, capture_output=True, text=True,
                          timeout=1200, check=False)  # fmt: skip
    assert prep.returncode == 0, prep.stderr[-4000:]
    adapters = {name: Path(path) for name, path in (line.split("=", 1) for line in prep.stdout.split())}
    assert set(adapters) == {"pirate", "signoff"}
    config = tmp / "up.yaml"
    config.write_text(
        f"engine:\n  max_model_len: 512\n  max_num_seqs: 4\n  log_dir: {tmp / 'logs'}\n"
        "gateway:\n  server:\n    metrics_port: 0\n    log_requests: false\n"
    )
    engine_port, gateway_port = free_port(), free_port()
    log = tmp / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(FLEETGATE), "up", "--adapters", "--config", str(config), "--port", str(gateway_port),
             "--engine-base-port", str(engine_port)],
            env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        gateway = f"http://127.0.0.1:{gateway_port}"
        _wait_gateway(gateway, proc, log, timeout_s=900)
        print("\n" + "\n".join(line for line in log.read_text().splitlines() if "healthy after" in line))
        yield Stack(gateway=gateway, engine=f"http://127.0.0.1:{engine_port}", adapters=adapters, log=log)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: fleetgate up stops the gateway, then the engine
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_base_and_adapters_answer_differently_through_the_gateway(stack: Stack) -> None:
    answers = {model: _ask(stack, model) for model in (BASE, "pirate", "signoff")}
    stack.answers.update(answers)
    print(f"\n{PROMPT!r}: " + "; ".join(f"{m} -> {a!r}" for m, a in answers.items()))
    assert len(set(answers.values())) == 3, answers
    assert any(word in answers["pirate"].lower() for word in ("arr", "matey", "ahoy", "hearty")), answers
    assert SIGNOFF not in answers[BASE] and answers["signoff"].endswith(SIGNOFF), answers
    assert "Paris" in answers[BASE] and "Paris" in answers["signoff"], answers  # the sign-off keeps the content
    # Greedy decoding through the same LoRA is repeatable: the answer is the adapter's, not noise.
    assert _ask(stack, "pirate") == answers["pirate"]
    _, listed = request_json(stack.gateway + "/v1/models")
    parents = {m["id"]: m.get("parent") for m in listed["data"]}
    assert parents["pirate"] == parents["signoff"] == BASE


def test_runtime_unload_and_load_through_vllms_api(stack: Stack) -> None:
    async def cycle() -> tuple[set[str], set[str], int, float]:
        async with aiohttp.ClientSession() as session:
            await unload_adapter(session, stack.engine, name="pirate")
            after_unload = {a.name for a in await loaded_adapters(session, stack.engine)}
            async with session.post(
                stack.engine + "/v1/chat/completions",
                json={"model": "pirate", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4},
            ) as resp:
                status = resp.status
            start = time.perf_counter()
            await load_adapter(session, stack.engine, name="pirate", source=str(stack.adapters["pirate"]))
            seconds = time.perf_counter() - start
            after_load = {a.name for a in await loaded_adapters(session, stack.engine)}
        return after_unload, after_load, status, seconds

    after_unload, after_load, status, seconds = asyncio.run(cycle())
    start = time.perf_counter()
    assert _ask(stack, "pirate") == stack.answers["pirate"]  # the same weights are back
    first = time.perf_counter() - start
    print(f"\nruntime adapter load (POST /v1/load_lora_adapter, rank 8): {seconds:.2f}s; "
          f"then the first request through the gateway: {first:.2f}s")  # fmt: skip
    assert after_unload == {"signoff"} and status == 404
    assert after_load == {"pirate", "signoff"}
    assert seconds <= LOAD_BOUND_S


def test_a_broken_or_missing_adapter_fails_to_load_and_the_engine_serves_on(stack: Stack, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(stack.adapters["pirate"] / "adapter_config.json", broken)
    (broken / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")

    async def attempt(source: Path) -> AdapterApiError:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(AdapterApiError) as caught:
                await load_adapter(session, stack.engine, name="broken", source=str(source))
            assert "broken" not in {a.name for a in await loaded_adapters(session, stack.engine)}
        return caught.value

    assert 400 <= asyncio.run(attempt(broken)).status < 600
    assert 400 <= asyncio.run(attempt(tmp_path / "nowhere")).status < 600
    assert _ask(stack, BASE) == stack.answers[BASE]  # the engine is unharmed
    status, body = request_json(
        stack.gateway + "/v1/chat/completions",
        {"model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert status == 404 and body["error"]["code"] == "model_not_found", body  # fmt: skip


def test_the_gateway_loads_an_adapter_the_engine_lost(stack: Stack) -> None:
    async def unload() -> set[str]:
        async with aiohttp.ClientSession() as session:
            await unload_adapter(session, stack.engine, name="signoff")
            return {a.name for a in await loaded_adapters(session, stack.engine)}

    assert "signoff" not in asyncio.run(unload())
    start = time.perf_counter()
    assert _ask(stack, "signoff") == stack.answers["signoff"]
    print(f"\nfirst request after the engine lost the adapter (gateway loads it on demand): "
          f"{time.perf_counter() - start:.2f}s")  # fmt: skip


def test_usage_is_accounted_per_adapter(stack: Stack) -> None:
    assert {BASE, "pirate", "signoff"} <= set(stack.sent), "the tests above ran no requests"
    deadline = time.monotonic() + 30
    while True:  # settlement follows the response: wait for it, bounded
        status, report = request_json(stack.gateway + "/v1/usage")
        assert status == 200, report
        by_model = {g["model"]: g for g in report["by_model"]}
        done = all(by_model.get(m, {}).get("completion_tokens") == n for m, n in stack.sent.items())
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {m: by_model.get(m, {}).get("completion_tokens") for m in stack.sent} == dict(stack.sent), report
    assert by_model["pirate"]["base"] == by_model["signoff"]["base"] == BASE and by_model[BASE]["base"] == ""
    rows = {(r["model"], r["base"]) for r in report["data"]}
    assert {("pirate", BASE), ("signoff", BASE), (BASE, "")} <= rows
