"""EngineArgs: validation and the vLLM 0.32 command line (checked against vLLM's own parser)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.engine.args import EngineArgs, KvEventsArgs


def _flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_minimal_argv_leaves_vllm_defaults() -> None:
    argv = EngineArgs(model="/models/m").to_argv()
    assert argv == ["--model", "/models/m", "--host", "127.0.0.1", "--port", "8000"]


def test_full_argv_renders_every_knob() -> None:
    args = EngineArgs(
        model="meta-llama/Llama-3.1-70B-Instruct",
        served_model_name="llama-70b",
        host="0.0.0.0",
        port=8080,
        dtype="bfloat16",
        quantization="fp8",
        kv_cache_dtype="fp8",
        max_model_len=8192,
        enable_prefix_caching=True,
        enable_chunked_prefill=False,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.92,
        tensor_parallel_size=4,
        speculative_method="draft_model",
        speculative_model="meta-llama/Llama-3.2-1B-Instruct",
        num_speculative_tokens=5,
        enforce_eager=True,
        extra_args=["--disable-log-requests"],
    )
    argv = args.to_argv()
    assert _flag_value(argv, "--served-model-name") == "llama-70b"
    assert _flag_value(argv, "--dtype") == "bfloat16"
    assert _flag_value(argv, "--quantization") == "fp8"
    assert _flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert _flag_value(argv, "--max-model-len") == "8192"
    assert "--enable-prefix-caching" in argv
    assert "--no-enable-chunked-prefill" in argv
    assert _flag_value(argv, "--max-num-seqs") == "64"
    assert _flag_value(argv, "--gpu-memory-utilization") == "0.92"
    assert _flag_value(argv, "--tensor-parallel-size") == "4"
    assert json.loads(_flag_value(argv, "--speculative-config")) == {
        "method": "draft_model",
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 5,
    }
    assert "--enforce-eager" in argv
    assert argv[-1] == "--disable-log-requests"
    assert args.extra_args == ("--disable-log-requests",)  # lists become tuples: the value stays hashable
    assert hash(args) == hash(dataclasses.replace(args))


def test_booleans_render_both_directions() -> None:
    on = EngineArgs(model="m", enable_prefix_caching=True, enable_chunked_prefill=True).to_argv()
    off = EngineArgs(model="m", enable_prefix_caching=False, enable_chunked_prefill=False).to_argv()
    assert {"--enable-prefix-caching", "--enable-chunked-prefill"} <= set(on)
    assert {"--no-enable-prefix-caching", "--no-enable-chunked-prefill"} <= set(off)
    assert not {"--enable-prefix-caching", "--enable-chunked-prefill"} & set(off)


def test_is_frozen_and_keyword_only() -> None:
    args = EngineArgs(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        EngineArgs("m")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model": " "}, "model"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"dtype": "fp64"}, "dtype"),
        ({"quantization": "magic"}, "quantization"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"speculative_method": "ngram"}, "num_speculative_tokens"),
        ({"speculative_method": "eagle", "num_speculative_tokens": 3}, "speculative_model"),
        ({"speculative_method": "ngram", "num_speculative_tokens": 3, "speculative_model": "d"}, "speculative_model"),
        ({"speculative_method": "telepathy", "num_speculative_tokens": 3}, "speculative_method"),
        ({"num_speculative_tokens": 3}, "speculative_method"),
        ({"speculative_method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"extra_args": ("--max-model-len=4096",)}, "extra_args"),
        ({"extra_args": ("-tp", "2")}, "extra_args"),
        ({"extra_args": "--foo"}, "extra_args"),
        (
            {"max_model_len": 8192, "max_num_batched_tokens": 2048, "enable_chunked_prefill": False},
            "max_num_batched_tokens",
        ),
    ],
)
def test_invalid_values_raise_clear_errors(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EngineArgs(**{"model": "m", **changes})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    """vLLM 0.32's own OpenAI-server argument parser (imports vLLM: ~10 s)."""
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args", reason="vllm is not installed")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = cli_args.make_arg_parser(FlexibleArgumentParser())
    return parser


@pytest.mark.slow
def test_vllm_parser_reads_back_every_knob(vllm_parser: argparse.ArgumentParser) -> None:
    args = EngineArgs(
        model="/models/m",
        served_model_name="served",
        host="0.0.0.0",
        port=8123,
        dtype="float16",
        quantization="awq",
        kv_cache_dtype="fp8",
        max_model_len=4096,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        gpu_memory_utilization=0.85,
        tensor_parallel_size=2,
        speculative_method="ngram",
        num_speculative_tokens=4,
        enforce_eager=True,
    )
    ns = vllm_parser.parse_args(args.to_argv())
    assert ns.model == "/models/m"
    assert ns.served_model_name == ["served"]
    assert (ns.host, ns.port) == ("0.0.0.0", 8123)
    assert ns.dtype == "float16"
    assert ns.quantization == "awq"
    assert ns.kv_cache_dtype == "fp8"
    assert ns.max_model_len == 4096
    assert ns.enable_prefix_caching is False
    assert ns.enable_chunked_prefill is True
    assert (ns.max_num_seqs, ns.max_num_batched_tokens) == (32, 2048)
    assert ns.gpu_memory_utilization == pytest.approx(0.85)
    assert ns.tensor_parallel_size == 2
    assert ns.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert ns.enforce_eager is True
    defaults = vllm_parser.parse_args(EngineArgs(model="m").to_argv())
    assert defaults.enable_prefix_caching is None  # omitted knobs keep vLLM's model-dependent default


def test_lora_renders_slots_explicitly_and_start_modules() -> None:
    args = EngineArgs(
        model="m", served_model_name="base", enable_lora=True, max_loras=4, max_lora_rank=32,
        lora_modules=[("sql", "/a/sql"), ("legal", "org/legal")],
    )  # fmt: skip
    argv = args.to_argv()
    i = argv.index("--enable-lora")
    assert argv[i : i + 5] == ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "32"]
    assert argv[argv.index("--lora-modules") + 1 :][:2] == ["sql=/a/sql", "legal=org/legal"]
    assert args.env() == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    defaults = EngineArgs(model="m", enable_lora=True)
    assert defaults.lora_slots() == (1, 16) and "--lora-modules" not in defaults.to_argv()
    off = EngineArgs(model="m")
    assert off.lora_slots() is None and off.env() == {} and "--enable-lora" not in off.to_argv()


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"max_loras": 2}, "enable_lora"),
        ({"lora_modules": [("a", "/p")]}, "enable_lora"),
        ({"enable_lora": True, "max_lora_rank": 24}, "max_lora_rank"),
        ({"enable_lora": True, "max_loras": 0}, "max_loras"),
        ({"enable_lora": True, "lora_modules": [("a", "/p"), ("a", "/q")]}, "lora_modules"),
        ({"enable_lora": True, "lora_modules": [("Bad Name", "/p")]}, "lora_modules"),
        ({"enable_lora": True, "served_model_name": "a", "lora_modules": [("a", "/p")]}, "lora_modules"),
        ({"enable_lora": True, "lora_modules": [("a", "/p q")]}, "lora_modules"),
        ({"extra_args": ["--max-loras", "3"]}, "typed field"),
    ],
)
def test_invalid_lora_args_raise(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EngineArgs(model="m", **changes)  # type: ignore[arg-type]


@pytest.mark.slow
def test_vllm_parser_reads_back_lora(vllm_parser: argparse.ArgumentParser) -> None:
    args = EngineArgs(model="/m", enable_lora=True, max_loras=3, max_lora_rank=64, lora_modules=[("s", "/a/s")])
    ns = vllm_parser.parse_args(args.to_argv())
    assert ns.enable_lora is True and (ns.max_loras, ns.max_lora_rank) == (3, 64)
    assert [(m.name, m.path) for m in ns.lora_modules] == [("s", "/a/s")]


def test_kv_events_render_vllms_json_config() -> None:
    args = EngineArgs(model="m", kv_events=KvEventsArgs(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558",
                                                        topic="kv", buffer_steps=500))
    argv = args.to_argv()
    assert json.loads(argv[argv.index("--kv-events-config") + 1]) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558", "topic": "kv", "buffer_steps": 500}
    local = EngineArgs(model="m", kv_events=KvEventsArgs(endpoint="ipc:///tmp/e0.pub")).to_argv()
    assert json.loads(local[local.index("--kv-events-config") + 1]) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "ipc:///tmp/e0.pub", "topic": ""}
    assert "--kv-events-config" not in EngineArgs(model="m").to_argv()


@pytest.mark.parametrize(
    ("kv", "changes", "needle"),
    [
        (KvEventsArgs(endpoint="tcp://10.0.0.5:5557"), {}, "binding"),  # vLLM would connect, not bind
        (KvEventsArgs(endpoint="tcp://*:"), {}, "tcp"),
        (KvEventsArgs(endpoint="http://x"), {}, "tcp"),
        (KvEventsArgs(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5557"), {}, "differ"),
        (KvEventsArgs(endpoint="tcp://*:5557", topic="a b"), {}, "topic"),
        (KvEventsArgs(endpoint="tcp://*:5557", buffer_steps=0), {}, "buffer_steps"),
        (KvEventsArgs(endpoint="tcp://*:5557"), {"enable_prefix_caching": False}, "prefix caching"),
        (None, {"extra_args": ["--kv-events-config", "{}"]}, "typed field"),
    ],
)
def test_invalid_kv_events_raise(kv: KvEventsArgs | None, changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EngineArgs(model="m", kv_events=kv, **changes)  # type: ignore[arg-type]


@pytest.mark.slow
def test_vllm_parser_reads_back_kv_events(vllm_parser: argparse.ArgumentParser) -> None:
    args = EngineArgs(model="/m", kv_events=KvEventsArgs(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558",
                                                         topic="kv", buffer_steps=100))
    config = vllm_parser.parse_args(args.to_argv()).kv_events_config
    assert config.enable_kv_cache_events is True and config.publisher == "zmq"
    assert (config.endpoint, config.replay_endpoint, config.topic, config.buffer_steps) == (
        "tcp://*:5557", "tcp://*:5558", "kv", 100)
