"""The GPU tier's configurations: every CRD engine knob is covered, each renders through the operator's
Deployment into the flags vLLM expects, and the ones meant to be refused are refused with an Invalid status."""

from __future__ import annotations

import json
import shlex

import pytest

from fleetgate.bench.gpu.matrix import SweepConfig, architecture, cpu_matrix, gpu_matrix
from fleetgate.bench.gpu.models import model_config, shape_names
from fleetgate.bench.gpu.render import render
from fleetgate.engine.hf_config import arch_facts
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.spec import Engine

CONFIGS = gpu_matrix(path=lambda s: f"/models/{s}", accelerator="nvidia-h100-80gb")
BY_NAME = {c.name: c for c in CONFIGS}
PROFILES = Profiles()


def _argv(config: SweepConfig) -> list[str]:
    rendered = render(name=config.name, spec=config.spec, profiles=PROFILES)
    assert rendered.invalid is None, rendered.invalid
    assert rendered.command[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    return rendered.command[3:]


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_engine_knob_of_the_crd_is_exercised() -> None:
    used = {key for c in CONFIGS for key in c.spec.get("engine", {})}
    # image: the container image, not an engine argument; extraArgs: used by every config (--load-format dummy).
    knobs = {field.alias or name for name, field in Engine.model_fields.items()} - {"image"}
    assert knobs - used == set()
    assert {c.spec["engine"].get("gpuMemoryUtilization") for c in CONFIGS} >= {0.5, 0.7, 0.8, 0.85, 0.9}


def test_names_are_unique_and_tensor_parallel_runs_last() -> None:
    assert len(BY_NAME) == len(CONFIGS)
    finals = [c for c in CONFIGS if c.final]
    assert finals and all(c.gpus == 2 and c.spec["engine"]["tensorParallelSize"] == 2 for c in finals)
    serving = [c for c in CONFIGS if c.expect == "serve"]
    assert serving[0].name == "llama8b-bf16" and serving[0].compiled  # the baseline first


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("llama8b-bf16", ["--enable-prefix-caching", "--gpu-memory-utilization", "--load-format"]),
        ("llama8b-fp8-kvfp8", ["--quantization", "--kv-cache-dtype"]),
        ("llama8b-lora-eager", ["--enable-lora", "--max-loras", "--max-lora-rank", "--enforce-eager"]),
        ("llama8b-ngram-sched-eager", ["--speculative-config", "--enable-chunked-prefill", "--max-num-batched-tokens",
                                       "--max-num-seqs", "--no-enable-prefix-caching"]),
        ("llama8b-draft-eager", ["--speculative-config"]),
        ("qwen7b-gptq-eager", ["--quantization", "--gpu-memory-utilization"]),
        ("gemma3-12b-eager", ["--kv-events-config"]),
        ("llama8b-nochunk-e4m3-eager", ["--no-enable-chunked-prefill", "--kv-cache-dtype"]),
        ("llama70b-fp8-tp2", ["--tensor-parallel-size"]),
    ],
)
def test_knobs_render_into_vllm_flags(name: str, flags: list[str]) -> None:
    argv = _argv(BY_NAME[name])
    for flag in flags:
        assert flag in argv, f"{name}: {flag} missing from {shlex.join(argv)}"
    assert _value(argv, "--load-format") == "dummy"
    assert _value(argv, "--model") == BY_NAME[name].spec["model"]["source"]


def test_speculative_and_lora_values() -> None:
    draft = json.loads(_value(_argv(BY_NAME["llama8b-draft-eager"]), "--speculative-config"))
    assert draft == {"method": "draft_model", "model": "/models/draft-llama-0.3b", "num_speculative_tokens": 4}
    ngram = json.loads(_value(_argv(BY_NAME["llama8b-ngram-sched-eager"]), "--speculative-config"))
    assert ngram == {"method": "ngram", "num_speculative_tokens": 4}
    lora = _argv(BY_NAME["llama8b-lora-eager"])
    assert (_value(lora, "--max-loras"), _value(lora, "--max-lora-rank")) == ("4", "16")
    env = render(name="x", spec=BY_NAME["llama8b-lora-eager"].spec, profiles=PROFILES).env
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_local_command_changes_only_interpreter_and_address() -> None:
    rendered = render(name="llama8b-bf16", spec=BY_NAME["llama8b-bf16"].spec, profiles=PROFILES)
    local = rendered.local_command(python="/usr/bin/python3.12", host="127.0.0.1", port=40123)
    pod = rendered.command
    assert local[0] == "/usr/bin/python3.12" and local[1:3] == pod[1:3]
    assert (_value(local, "--host"), _value(local, "--port")) == ("127.0.0.1", "40123")
    strip = lambda argv: [a for i, a in enumerate(argv) if a not in ("--host", "--port")  # noqa: E731
                          and argv[i - 1] not in ("--host", "--port")]  # fmt: skip
    assert strip(local[1:]) == strip(pod[1:])


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.expect == "invalid"], ids=lambda c: c.name)
def test_refused_configurations_get_an_invalid_status(config: SweepConfig) -> None:
    rendered = render(name=config.name, spec=config.spec, profiles=PROFILES)
    assert rendered.invalid is not None and rendered.status is not None
    assert rendered.status["phase"] == "Invalid"
    assert config.raw_argv, "vLLM's preflight needs the arguments the operator would have rendered"


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.expect == "serve"], ids=lambda c: c.name)
def test_serving_configurations_are_planned_to_fit(config: SweepConfig) -> None:
    resolved = render(name=config.name, spec=config.spec, profiles=PROFILES).resolved
    assert resolved is not None and resolved.plan is not None and resolved.plan.fits, config.name


def test_model_shapes_match_the_published_parameter_counts() -> None:
    # Published counts of the real models (vocabularies as published): the configs differ only in vocab_size.
    published = {"llama-3.1-8b": (128256, 8_030_261_248), "llama-3.1-70b": (128256, 70_553_706_496),
                 "qwen2.5-7b": (152064, 7_615_616_512), "mixtral-8x7b": (32000, 46_702_792_704)}  # fmt: skip
    for shape, (vocab, count) in published.items():
        config = {**model_config(shape), "vocab_size": vocab}
        assert arch_facts(config).parameters == count, shape
    assert set(published) <= set(shape_names())


def test_architecture_facts_reach_the_spec() -> None:
    gemma = architecture("gemma-3-12b")
    assert (gemma["slidingWindowLayers"], gemma["slidingWindow"], gemma["tiedEmbeddings"]) == (40, 1024, True)
    assert architecture("mixtral-8x7b")["expertsPerToken"] == 2


def test_cpu_dry_run_has_a_final_stage_and_a_refusal() -> None:
    configs = cpu_matrix(path=lambda s: f"/m/{s}")
    assert any(c.final for c in configs) and any(c.expect == "invalid" for c in configs)
    for config in configs:
        rendered = render(name=config.name, spec=config.spec, profiles=PROFILES)
        assert (rendered.invalid is not None) == (config.expect == "invalid"), config.name
