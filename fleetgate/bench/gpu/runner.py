"""Run one configuration: render it, start its engine, check it serves, measure it, stop it, compare.

`EngineRunner.run` returns one result record (a JSON-ready dict, one line of results.jsonl):
- a spec the operator refuses is not started (`status` "invalid", with the operator's message and the
  phase of the status it writes); a config expected to be refused that renders is "not_refused";
- otherwise the engine starts in its own process group with the Deployment's command and env (loopback,
  its own port, `CUDA_VISIBLE_DEVICES` = its GPU slots) and logs to `<logs>/<name>.log`. Milestones of its
  start-up are timed as the log shows them. Ready = `/health` answers 200. Then: one short completion
  (it serves), a LoRA adapter loaded through the runtime API when asked (the operator's client), one
  answer checked for sense with real weights, the calibration probe when asked (`calibration`: TTFT by
  prompt length, TPOT by batch), the load levels, and the plan-vs-log comparison;
- every wait is bounded by the configuration's deadline, except that an engine whose log says it is
  initialised (`init engine ... took`: weights, profile and KV cache done, the API server is coming up)
  is waited for up to the sweep's hard deadline: a slow start is not a failure when vLLM did come up
  (`deadline_extended` in the record says so); the engine is always stopped (SIGTERM to its
  process group, SIGKILL after a grace period) and, on CUDA, its GPUs' memory awaited back.
Statuses: served, invalid, not_refused, failed (exited or unhealthy: `failure` holds vLLM's own error
line), timeout (not ready by the deadline), refused_by_vllm (the preflight's verdict; set by the sweep).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetgate.bench.gpu.compare import compare, within_target
from fleetgate.bench.gpu.load import LAST_ID, calibration, post_json, requests_for, run_level
from fleetgate.bench.gpu.matrix import SweepConfig
from fleetgate.bench.gpu.render import Rendered, render
from fleetgate.core.localredis import free_port
from fleetgate.engine.capacity import CapacityPlan
from fleetgate.engine.vllm_log import failure_reason, parse_engine_log
from fleetgate.operator.profiles import Profiles

MILESTONES: dict[str, re.Pattern[str]] = {
    "weights_loaded": re.compile(r"Model loading took"),
    "compiled": re.compile(r"torch\.compile took|Compiling a graph for"),
    "kv_allocated": re.compile(r"KV cache size:"),
    "graphs_captured": re.compile(r"Graph capturing finished"),
    "engine_initialized": re.compile(r"init engine \(profile"),
    "api_listening": re.compile(r"Starting vLLM (?:API )?server|Application startup complete"),
}
STOP_GRACE_S = 20.0
STOP_RESERVE_S = 15.0  # of a configuration's deadline, kept for stopping its engine
LATE_BENCH_S = 30.0  # checks and load levels of an engine that became ready past its own deadline
SENSE_QUESTION = "What is the capital of France?"  # Gemma 3 270M answers "... Paris." (tests/e2e)


@dataclass(frozen=True, kw_only=True)
class RunnerSetup:
    profiles: Profiles
    python: str
    work_dir: Path
    log_dir: Path
    device: str  # "cuda" or "cpu"
    base_env: Mapping[str, str] = field(default_factory=dict)
    adapters: Mapping[str, Path] = field(default_factory=dict)  # config name -> generated adapter directory
    vocab_limit: int = LAST_ID  # prompt token ids stay below this and below the model's vocabulary


def _http_status(url: str, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status: int = response.status
            return status
    except OSError:
        return 0


def gpu_memory_used_mib(slots: tuple[str, ...]) -> list[int] | None:
    """Memory in use on the given GPUs (nvidia-smi), or None where it cannot be read."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", ",".join(slots)],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return [int(v) for v in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def wait_gpus_released(slots: tuple[str, ...], *, timeout_s: float = 30.0, below_mib: int = 2048) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = gpu_memory_used_mib(slots)
        if used is None or max(used) < below_mib:
            return True
        time.sleep(1.0)
    return False


class Engine:
    """One engine process group and its log; always stopped by `stop()`."""

    def __init__(self, *, command: list[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> None:
        self.command, self.log_path = command, log_path
        self._log = log_path.open("wb")
        self._started = time.monotonic()
        self.proc = subprocess.Popen(command, env=dict(env), cwd=str(cwd), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.milestones: dict[str, float] = {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _note_milestones(self) -> None:
        text = self.text()
        for name, pattern in MILESTONES.items():
            if name not in self.milestones and pattern.search(text):
                self.milestones[name] = round(time.monotonic() - self._started, 1)

    def wait_ready(self, *, base_url: str, deadline: float, extend_to: float | None = None) -> str | None:
        """None when /health answers 200; else why not ("exited", "timeout"). An engine still starting at
        `deadline` whose log says it is initialised (or whose API server listens) is waited for up to
        `extend_to` (milestone `deadline_extended`: when that happened)."""
        while True:
            self._note_milestones()
            if not self.alive():
                return "exited"
            if _http_status(base_url + "/health") == 200:
                self.milestones["ready"] = round(time.monotonic() - self._started, 1)
                return None
            if time.monotonic() >= deadline:
                if extend_to is None or extend_to <= deadline or not self.initialised():
                    return "timeout"
                deadline = extend_to
                self.milestones["deadline_extended"] = round(time.monotonic() - self._started, 1)
            time.sleep(1.0)

    def initialised(self) -> bool:
        return "engine_initialized" in self.milestones or "api_listening" in self.milestones

    def stop(self) -> float:
        """SIGTERM the group, SIGKILL after the grace period; seconds it took."""
        t = time.monotonic()
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        else:  # the root exited: make sure no child of its group lingers on a GPU
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
        return round(time.monotonic() - t, 1)


class EngineRunner:
    def __init__(self, setup: RunnerSetup, *, log: Callable[[str], None] = print) -> None:
        self.setup = setup
        self.log = log

    def env(self, rendered: Rendered, slots: tuple[str, ...]) -> dict[str, str]:
        env = {**os.environ, **self.setup.base_env, **rendered.env}
        env.update({
            "HF_HOME": str(self.setup.work_dir / "hf-home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "VLLM_LOGGING_COLOR": "0",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        })  # fmt: skip
        if self.setup.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(slots)
        return env

    def run(
        self, config: SweepConfig, *, slots: tuple[str, ...], deadline: float, hard_deadline: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        rendered = render(name=config.name, spec=config.spec, profiles=self.setup.profiles)
        record: dict[str, Any] = {"name": config.name, "expect": config.expect, "knobs": list(config.knobs),
                                  "slots": list(slots), "compiled": config.compiled}  # fmt: skip
        if rendered.invalid is not None:
            phase = (rendered.status or {}).get("phase")
            status = "invalid" if config.expect == "invalid" else "failed"
            return {**record, "status": status, "invalid_message": rendered.invalid, "operator_phase": phase}
        if config.expect == "invalid":
            return {**record, "status": "not_refused", "command": rendered.command}
        return self._serve(config, rendered, record, slots=slots, deadline=deadline,
                           hard_deadline=max(deadline, hard_deadline or deadline))  # fmt: skip

    def _serve(
        self,
        config: SweepConfig,
        rendered: Rendered,
        record: dict[str, Any],
        *,
        slots: tuple[str, ...],
        deadline: float,
        hard_deadline: float,
    ) -> dict[str, Any]:
        assert rendered.resolved is not None
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        command = rendered.local_command(python=self.setup.python, host="127.0.0.1", port=port)
        log_path = self.setup.log_dir / f"{config.name}.log"
        record.update(command=command, pod_command=rendered.command, pod_env=rendered.env, log_file=log_path.name)
        plan = rendered.resolved.plan
        record["plan"] = plan.to_status() if plan is not None else None
        started = time.monotonic()
        work_deadline = deadline - STOP_RESERVE_S
        self.log(f"{config.name}: starting on {','.join(slots)} (port {port})")
        engine = Engine(command=command, env=self.env(rendered, slots), log_path=log_path, cwd=self.setup.work_dir)
        try:
            why = engine.wait_ready(base_url=base_url, deadline=work_deadline,
                                    extend_to=hard_deadline - STOP_RESERVE_S)  # fmt: skip
            record["milestones"] = engine.milestones
            if "deadline_extended" in engine.milestones:  # it came up late: leave it time to be measured
                record["deadline_extended"] = True
                work_deadline = min(hard_deadline - STOP_RESERVE_S,
                                    max(work_deadline, time.monotonic() + LATE_BENCH_S))  # fmt: skip
                deadline = max(deadline, work_deadline + STOP_RESERVE_S)
            if why is None:
                self.log(f"{config.name}: ready in {engine.milestones['ready']:.0f}s")
                record.update(self._exercise(config, base_url=base_url, model=rendered.resolved.served_model,
                                             deadline=work_deadline))  # fmt: skip
            else:
                record["status"] = "timeout" if why == "timeout" else "failed"
                record["failure"] = failure_reason(engine.text()) or why
                self.log(f"{config.name}: {record['status']}: {record['failure']}")
        finally:
            record["stop_s"] = engine.stop()
            if self.setup.device == "cuda":
                wait = max(1.0, min(30.0, deadline - time.monotonic()))
                record["gpus_released"] = wait_gpus_released(slots, timeout_s=wait)
        report = parse_engine_log(engine.text())
        record["vllm_log"] = report.to_dict()
        if isinstance(plan, CapacityPlan) and report.kv_tokens is not None:  # an encoder plan has no KV cache
            figures = compare(plan=plan, log=report)
            record["comparison"] = {k: v.to_dict() for k, v in figures.items()}
            record["within_5pct"] = within_target(figures)
        record["total_s"] = round(time.monotonic() - started, 1)
        return record

    def _exercise(self, config: SweepConfig, *, base_url: str, model: str, deadline: float) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "served"}
        status, body = asyncio.run(
            post_json(
                base_url + "/v1/completions",
                {"model": model, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True, "temperature": 0.0},
            )
        )
        usage = body.get("usage", {}) if isinstance(body, dict) else {}
        out["serve"] = {"http": status, "completion_tokens": usage.get("completion_tokens")}
        if status != 200 or usage.get("completion_tokens") != 8:
            out.update(status="failed", failure=f"completion: HTTP {status}: {str(body)[:300]}")
            return out
        if config.lora_rank is not None:
            out["lora"] = asyncio.run(self._lora(config, base_url=base_url))
            if not out["lora"].get("ok"):
                out.update(status="failed", failure=f"LoRA: {out['lora'].get('error')}")
        if config.sense_check:
            out["sense"] = asyncio.run(_sense(base_url=base_url, model=model))
            if not out["sense"]["ok"]:
                out.update(status="failed", failure=f"sense check: {out['sense']['answer']!r}")
        vocab = (config.spec.get("model", {}).get("architecture") or {}).get("vocabSize")
        limit = min(self.setup.vocab_limit, int(vocab)) if vocab else self.setup.vocab_limit
        if config.calibrate:  # before the levels: the cost report's fit needs it, and it is the shorter (~20 s)
            out["calibration"] = asyncio.run(calibration(base_url=base_url, model=model, deadline=deadline - 5,
                                                         vocab_limit=limit))  # fmt: skip
            self.log(f"{config.name}: calibration: " + ", ".join(_probe_text(lv) for lv in out["calibration"]))
        levels = []
        for concurrency in config.levels:
            if time.monotonic() > deadline - 5:
                break
            level = asyncio.run(run_level(base_url=base_url, model=model, concurrency=concurrency,
                                          requests=requests_for(concurrency=concurrency, rounds=config.rounds),
                                          deadline=deadline - 5, vocab_limit=limit))  # fmt: skip
            levels.append(level.to_dict())
            ttft = f"{level.ttft_p50_s:.3f}s" if level.ttft_p50_s is not None else "none"
            self.log(f"{config.name}: {concurrency} streams: {level.output_tokens_per_s:.0f} tok/s, TTFT p50 {ttft}, "
                     f"{level.ok}/{level.requests} ok")  # fmt: skip
        out["bench"] = levels
        return out

    async def _lora(self, config: SweepConfig, *, base_url: str) -> dict[str, Any]:
        import aiohttp

        from fleetgate.engine.lora_api import AdapterApiError, load_adapter, loaded_adapters

        folder = self.setup.adapters.get(config.name)
        if folder is None:
            return {"ok": False, "error": "no adapter was generated"}
        name = "gpu-tier-adapter"
        try:
            async with aiohttp.ClientSession() as session:
                t = time.monotonic()
                await load_adapter(session, base_url, name=name, source=str(folder), timeout_s=60)
                load_s = round(time.monotonic() - t, 2)
                listed = [a.name for a in await loaded_adapters(session, base_url)]
        except AdapterApiError as exc:
            return {"ok": False, "error": str(exc)}
        status, body = await post_json(
            base_url + "/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
        )
        ok = status == 200 and name in listed
        return {"ok": ok, "load_s": load_s, "listed": listed, "http": status,
                "error": None if ok else str(body)[:300]}  # fmt: skip


def _probe_text(level: dict[str, Any]) -> str:
    if level["probe"] == "ttft":
        figure = level["ttft_p50_s"]
        return f"TTFT({level['prompt_tokens']}) " + (f"{figure:.3f}s" if figure is not None else "none")
    figure = level["tpot_p50_s"]
    return f"TPOT({level['concurrency']}) " + (f"{figure * 1000:.1f}ms" if figure is not None else "none")


async def _sense(*, base_url: str, model: str) -> dict[str, Any]:
    status, body = await post_json(base_url + "/v1/chat/completions", {
        "model": model, "max_tokens": 24, "temperature": 0.0,
        "messages": [{"role": "user", "content": SENSE_QUESTION}]})  # fmt: skip
    answer = ""
    if isinstance(body, dict) and body.get("choices"):
        answer = str(body["choices"][0].get("message", {}).get("content", ""))
    return {"http": status, "answer": answer, "ok": status == 200 and "paris" in answer.lower()}
