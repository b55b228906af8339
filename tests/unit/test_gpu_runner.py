"""The GPU tier's runner against a fake engine: the operator's rendered command starts it, the runner waits for
/health, checks it serves, loads a LoRA adapter through the runtime API, measures load levels, compares the
plan with the log, and always stops the process group; a dead or stalled engine is reported, not awaited.

The fake is a `vllm.entrypoints.openai.api_server` module placed first on PYTHONPATH (so the command is the
one the Deployment runs), an aiohttp server that logs vLLM 0.32's CPU KV line, refuses token ids beyond the
model's vocabulary (as vLLM does) and streams `max_tokens` chunks.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fleetgate.bench.gpu.matrix import SweepConfig, cpu_matrix
from fleetgate.bench.gpu.models import make_lora_adapter, model_config, prepare_models, write_fallback_tokenizer
from fleetgate.bench.gpu.runner import STOP_RESERVE_S, EngineRunner, RunnerSetup
from fleetgate.operator.profiles import Profiles

FAKE = r"""
import asyncio, json, os, sys, time
from aiohttp import web

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
model = args[args.index("--served-model-name") + 1]
mode = os.environ.get("FAKE_MODE", "ok")
print("(EngineCore pid=1) INFO 11-27 14:00:00 [gpu_model_runner.py:5150] Model loading took 0.13 GiB memory and "
      "0.5 seconds", flush=True)
if mode == "crash":
    print("(EngineCore pid=1) ValueError: the fake engine refuses", flush=True)
    sys.exit(1)
print("(EngineCore pid=1) INFO 11-27 14:00:01 [kv_cache_utils.py:2327] CPU KV cache size: " + os.environ["FAKE_KV"]
      + " tokens, Maximum concurrency for 2,048 tokens per request: " + os.environ["FAKE_CONC"] + "x", flush=True)
if mode == "late":  # initialised, but the API server answers only after FAKE_READY_AFTER_S
    print("(EngineCore pid=1) INFO 11-27 14:00:02 [core.py:347] init engine (profile, create kv cache, warmup "
          "model) took 2.00 s", flush=True)
ready_at = time.monotonic() + float(os.environ.get("FAKE_READY_AFTER_S", "0"))
adapters = []

async def health(request):
    return web.Response(status=503 if mode == "stall" or time.monotonic() < ready_at else 200)

async def completions(request):
    body = await request.json()
    n = int(body["max_tokens"])
    if body["model"] not in [model, *adapters]:
        return web.json_response({"error": "no such model"}, status=404)
    prompt = body["prompt"]
    if isinstance(prompt, list) and max(prompt) >= int(os.environ.get("FAKE_VOCAB", "128256")):
        return web.json_response({"error": f"Token id {max(prompt)} is out of vocabulary"}, status=400)
    if os.environ.get("FAKE_MODE") == "stream-error" and body.get("stream"):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
        return resp
    if not body.get("stream"):
        return web.json_response({"choices": [{"text": "x" * n}], "usage": {"completion_tokens": n}})
    resp = web.StreamResponse()
    await resp.prepare(request)
    await asyncio.sleep(len(prompt) * 1e-5 if isinstance(prompt, list) else 0)  # prefill: 10 us a token
    for _ in range(n):
        await resp.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await asyncio.sleep(0.001)
    await resp.write(('data: {"choices": [], "usage": {"completion_tokens": %d}}\n\n' % n).encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp

async def load(request):
    adapters.append((await request.json())["lora_name"])
    return web.Response(text="ok")

async def models(request):
    return web.json_response({"data": [{"id": model}] + [{"id": a, "parent": model, "root": "/a"} for a in adapters]})

app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/completions", completions)
app.router.add_post("/v1/load_lora_adapter", load)
app.router.add_get("/v1/models", models)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""


@pytest.fixture
def setup(tmp_path: Path) -> RunnerSetup:
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parent.parent, package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE)
    work, logs = tmp_path / "work", tmp_path / "logs"
    logs.mkdir()
    tokenizer = write_fallback_tokenizer(folder=tmp_path / "tok", vocab_size=300)
    prepare_models(root=work / "models", tokenizer_dir=tokenizer, names=["tiny-llama"])
    adapter = make_lora_adapter(folder=work / "adapter", base_config=model_config("tiny-llama"), rank=8)
    env = {"PYTHONPATH": str(tmp_path / "fake")}
    return RunnerSetup(profiles=Profiles(), python=sys.executable, work_dir=work, log_dir=logs, device="cpu",
                       base_env=env, adapters={"cpu-tiny-lora": adapter})  # fmt: skip


def _config(setup: RunnerSetup, name: str) -> SweepConfig:
    configs = {c.name: c for c in cpu_matrix(path=lambda s: str(setup.work_dir / "models" / s))}
    return configs[name]


def test_serves_loads_an_adapter_measures_and_compares(setup: RunnerSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(setup, "cpu-tiny-lora")
    runner = EngineRunner(setup, log=lambda _m: None)
    monkeypatch.setenv("FAKE_KV", "1,000")
    monkeypatch.setenv("FAKE_CONC", "0.49")
    record = runner.run(config, slots=("cpu",), deadline=time.monotonic() + 60)
    assert record["status"] == "served", record.get("failure")
    assert record["serve"] == {"http": 200, "completion_tokens": 8}
    assert record["lora"]["ok"] and record["lora"]["listed"] == ["gpu-tier-adapter"]
    assert [lv["concurrency"] for lv in record["bench"]] == [2]
    level = record["bench"][0]
    assert level["ok"] == level["requests"] == 2 and level["output_tokens"] == 2 * 128
    assert record["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in record["command"] and record["pod_env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert record["vllm_log"]["kv_tokens"] == 1000
    plan_tokens = record["plan"]["kvCacheTokens"]
    assert record["comparison"]["kv_tokens"]["error_pct"] == pytest.approx((plan_tokens - 1000) / 1000 * 100, abs=0.01)
    assert record["milestones"]["ready"] > 0 and "kv_allocated" in record["milestones"]


def test_errors_inside_a_stream_count_as_failures(setup: RunnerSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "stream-error")
    monkeypatch.setenv("FAKE_KV", "1")
    monkeypatch.setenv("FAKE_CONC", "1")
    record = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "cpu-tiny"), slots=("cpu",),
                                                          deadline=time.monotonic() + 60)  # fmt: skip
    assert record["status"] == "served"  # it started and answered a plain completion
    assert all(lv["ok"] == 0 and "boom" in lv["error"] for lv in record["bench"])


def test_a_crashing_engine_is_failed_with_its_own_error(setup: RunnerSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "crash")
    record = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "cpu-tiny"), slots=("cpu",),
                                                          deadline=time.monotonic() + 60)  # fmt: skip
    assert record["status"] == "failed" and record["failure"] == "ValueError: the fake engine refuses"


def test_a_stalled_engine_times_out_and_is_stopped(setup: RunnerSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODE", "stall")
    monkeypatch.setenv("FAKE_KV", "1")
    monkeypatch.setenv("FAKE_CONC", "1")
    start = time.monotonic()
    record = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "cpu-tiny"), slots=("cpu",),
                                                          deadline=start + 4, hard_deadline=start + 300)  # fmt: skip
    assert record["status"] == "timeout" and "deadline_extended" not in record  # never initialised: no extension
    assert time.monotonic() - start < 4 + 25  # the deadline, plus at most the stop grace
    assert not any(p.name.isdigit() and _cmdline(p).find(str(setup.work_dir)) >= 0
                   for p in Path("/proc").iterdir())  # fmt: skip


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_refused_spec_never_starts_an_engine(setup: RunnerSetup) -> None:
    record = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "refused-maxnumseqs"), slots=("cpu",),
                                                          deadline=time.monotonic() + 5)  # fmt: skip
    assert record["status"] == "invalid" and record["operator_phase"] == "Invalid"
    assert "maxNumSeqs 4096" in record["invalid_message"] and "command" not in record


def test_an_initialised_engine_is_awaited_past_its_own_deadline(setup: RunnerSetup,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The first H100 call killed three engines seconds before they were ready: a start-up whose log says the
    engine is initialised is waited for up to the sweep's hard deadline, and then measured."""
    monkeypatch.setenv("FAKE_MODE", "late")
    monkeypatch.setenv("FAKE_READY_AFTER_S", "6")
    monkeypatch.setenv("FAKE_KV", "1")
    monkeypatch.setenv("FAKE_CONC", "1")
    start = time.monotonic()
    own = start + STOP_RESERVE_S + 3  # three seconds to come up: not enough
    record = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "cpu-tiny"), slots=("cpu",), deadline=own,
                                                          hard_deadline=start + 120)  # fmt: skip
    assert record["status"] == "served", record.get("failure")
    assert record["deadline_extended"] and record["milestones"]["ready"] > 3
    assert record["bench"] and all(lv["ok"] == lv["requests"] for lv in record["bench"])
    late = EngineRunner(setup, log=lambda _m: None).run(_config(setup, "cpu-tiny"), slots=("cpu",),
                                                        deadline=time.monotonic() + STOP_RESERVE_S + 3)  # fmt: skip
    assert late["status"] == "timeout"  # without a hard deadline beyond its own, the own deadline holds


def test_the_calibration_probe_measures_ttft_by_length_and_tpot_by_batch(setup: RunnerSetup,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate` (the compiled 70B's): after the load levels, TTFT at three prompt lengths (one output token)
    and TPOT at three batch sizes, each from fresh prompts; the throughput file turns them into the points
    `fleetgate bench cost` fits step times from."""
    monkeypatch.setenv("FAKE_KV", "1")
    monkeypatch.setenv("FAKE_CONC", "1")
    config = replace(_config(setup, "cpu-tiny"), calibrate=True)
    record = EngineRunner(setup, log=lambda _m: None).run(config, slots=("cpu",), deadline=time.monotonic() + 90)
    assert record["status"] == "served", record.get("failure")
    cal = record["calibration"]
    assert [(lv["probe"], lv["concurrency"], lv["prompt_tokens"]) for lv in cal] == [
        ("ttft", 1, 128), ("ttft", 1, 1024), ("ttft", 1, 4096), ("decode", 1, 64), ("decode", 16, 64),
        ("decode", 64, 64)]
    assert all(lv["ok"] == lv["requests"] for lv in cal) and [lv["requests"] for lv in cal] == [3, 3, 3, 3, 48, 192]
    assert all(lv["tpot_p50_s"] is None and lv["output_tokens"] == 3 for lv in cal[:3])  # one token each
    assert all(0.001 <= lv["tpot_p50_s"] < 0.5 for lv in cal[3:])  # the fake's 1 ms between tokens, and more
    assert cal[2]["ttft_p50_s"] > cal[0]["ttft_p50_s"] + 0.02  # the fake prefills 4096 tokens in 41 ms, 128 in 1
    assert all(lv["output_tokens"] == 32 * lv["requests"] for lv in cal[3:])
