"""Typed vLLM engine knobs and their command line.

`EngineArgs` holds the settings FleetGate controls on a vLLM 0.32 OpenAI server, validated at
construction, and `to_argv()` renders the arguments that follow
`python -m vllm.entrypoints.openai.api_server` (see `VLLM_MODULE`). Flag names are vLLM 0.32's
(`vllm/engine/arg_utils.py`, `vllm/entrypoints/launchers/cli_args.py`): booleans with a vLLM-side
default use the `--x`/`--no-x` pair of `argparse.BooleanOptionalAction`, and speculative decoding is
one JSON object in `--speculative-config`. A knob left at `None` is omitted so vLLM's own default
(often model-dependent) applies.

LoRA: `enable_lora` renders `--enable-lora --max-loras N --max-lora-rank R` (always explicit, so the capacity
plan's adapter slots are exactly vLLM's) and `lora_modules` the adapters loaded at start-up
(`--lora-modules name=path ...`). `env()` holds what the engine process needs besides flags:
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` with LoRA on, so adapters can be loaded and unloaded at runtime.

KV-cache events: `kv_events` renders `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
"endpoint":...,"replay_endpoint":...,"topic":...}'` (the same keys in vLLM 0.26 and 0.32), validated so
that vLLM binds the addresses (see `KvEventsArgs`) and prefix caching is not off.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.core.adapters import valid_adapter_name
from fleetgate.core.errors import ConfigError

VLLM_MODULE = "vllm.entrypoints.openai.api_server"

DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")
# Quantization methods of vLLM 0.32 (`QuantizationMethods`) that FleetGate accepts; "none" means unquantized.
QUANTIZATIONS: tuple[str, ...] = (
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "fp8",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp4",
    "mxfp4",
    "experts_int8",
    "moe_wna16",
    "torchao",
    # compressed-tensors with quantized tied embeddings on CPU: FleetGate's vLLM plugin
    # (`fleetgate.local.vllm_plugin`), known to vLLM wherever fleetgate is installed beside it.
    "fleetgate-ct",
)
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# Methods that read a separate draft/head model (`speculative_model` required).
SPECULATIVE_METHODS_WITH_MODEL: tuple[str, ...] = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")
# Methods that need no separate model: n-gram prompt lookup, suffix decoding, the model's own MTP heads.
SPECULATIVE_METHODS_WITHOUT_MODEL: tuple[str, ...] = ("ngram", "suffix", "mtp")
SPECULATIVE_METHODS: tuple[str, ...] = SPECULATIVE_METHODS_WITH_MODEL + SPECULATIVE_METHODS_WITHOUT_MODEL

# vLLM 0.32's LoRA defaults (`LoRAConfig`) and the ranks `--max-lora-rank` accepts (`MaxLoRARanks`).
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK = 16
LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# vLLM (0.26 and 0.32, `lora/layers/logits_processor.py`) wraps a model's lm_head when LoRA is on and refuses
# larger vocabularies at start-up: "When using LoRA, vocab size must be <= 258048".
LORA_MAX_VOCAB = 258048

# Flags rendered from typed fields; `extra_args` may not set them a second time.
OWNED_FLAGS: frozenset[str] = frozenset(
    {
        "--model",
        "--served-model-name",
        "--host",
        "--port",
        "--dtype",
        "--quantization",
        "-q",
        "--kv-cache-dtype",
        "--max-model-len",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--tensor-parallel-size",
        "-tp",
        "--speculative-config",
        "-sc",
        "--enforce-eager",
        "--no-enforce-eager",
        "--enable-lora",
        "--no-enable-lora",
        "--max-loras",
        "--max-lora-rank",
        "--lora-modules",
        "--kv-events-config",
    }
)
# `--kv-events-config` JSON keys (vLLM 0.26 and 0.32 `KVEventsConfig`: same names, same meaning).
KV_EVENTS_PUBLISHER = "zmq"


@dataclass(frozen=True, kw_only=True, slots=True)
class KvEventsArgs:
    """vLLM's KV-cache event publisher (`--kv-events-config`), read by the gateway's precise prefix routing.

    vLLM *binds* an address that contains `*` or `::` or is `ipc://`/`inproc://` and *connects* any other,
    so a pod publishes on `tcp://*:<port>` (the gateways connect to the pod IP) and a laptop on `ipc://`
    (loopback only). The replay socket is always bound."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int | None = None  # batches kept for replay (vLLM default 10000)

    def config(self) -> dict[str, object]:
        out: dict[str, object] = {"enable_kv_cache_events": True, "publisher": KV_EVENTS_PUBLISHER,
                                  "endpoint": self.endpoint, "topic": self.topic}
        if self.replay_endpoint is not None:
            out["replay_endpoint"] = self.replay_endpoint
        if self.buffer_steps is not None:
            out["buffer_steps"] = self.buffer_steps
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineArgs:
    """The vLLM knobs FleetGate sets; `None` leaves vLLM's default in place."""

    model: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    speculative_method: str | None = None
    speculative_model: str | None = None
    num_speculative_tokens: int | None = None
    enforce_eager: bool = False
    enable_lora: bool = False
    max_loras: int | None = None  # with enable_lora: DEFAULT_MAX_LORAS when None
    max_lora_rank: int | None = None  # with enable_lora: DEFAULT_MAX_LORA_RANK when None
    lora_modules: Sequence[tuple[str, str]] = ()  # (name, path) loaded at start-up; stored as a tuple
    kv_events: KvEventsArgs | None = None  # publish KV-cache events (precise prefix routing); None: off
    extra_args: Sequence[str] = ()  # stored as a tuple, so the value stays hashable

    def __post_init__(self) -> None:
        if not isinstance(self.extra_args, str | tuple):
            object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not isinstance(self.lora_modules, tuple):
            object.__setattr__(self, "lora_modules", tuple(tuple(m) for m in self.lora_modules))
        _validate(self)

    def lora_slots(self) -> tuple[int, int] | None:
        """(max_loras, max_lora_rank) vLLM preallocates with LoRA on; None with LoRA off."""
        if not self.enable_lora:
            return None
        return self.max_loras or DEFAULT_MAX_LORAS, self.max_lora_rank or DEFAULT_MAX_LORA_RANK

    def env(self) -> dict[str, str]:
        """Environment the engine process needs for these args (runtime adapter loading with LoRA on)."""
        return {RUNTIME_LORA_ENV: "True"} if self.enable_lora else {}

    def speculative_config(self) -> dict[str, object] | None:
        """The `--speculative-config` object, or None without speculative decoding."""
        if self.speculative_method is None:
            return None
        config: dict[str, object] = {
            "method": self.speculative_method,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.speculative_model is not None:
            config["model"] = self.speculative_model
        return config

    def to_argv(self) -> list[str]:
        """Arguments after `python -m vllm.entrypoints.openai.api_server`, in a stable order."""
        argv = ["--model", self.model]
        if self.served_model_name is not None:
            argv += ["--served-model-name", self.served_model_name]
        argv += ["--host", self.host, "--port", str(self.port)]
        if self.dtype != "auto":
            argv += ["--dtype", self.dtype]
        if self.quantization is not None:
            argv += ["--quantization", self.quantization]
        if self.kv_cache_dtype != "auto":
            argv += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        argv += _bool_flag("enable-prefix-caching", self.enable_prefix_caching)
        argv += _bool_flag("enable-chunked-prefill", self.enable_chunked_prefill)
        if self.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            argv += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", _float_text(self.gpu_memory_utilization)]
        if self.tensor_parallel_size != 1:
            argv += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        spec = self.speculative_config()
        if spec is not None:
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        slots = self.lora_slots()
        if slots is not None:
            argv += ["--enable-lora", "--max-loras", str(slots[0]), "--max-lora-rank", str(slots[1])]
            if self.lora_modules:
                argv += ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules)]
        if self.kv_events is not None:
            argv += ["--kv-events-config", json.dumps(self.kv_events.config(), sort_keys=True, separators=(",", ":"))]
        argv += list(self.extra_args)
        return argv


def _bool_flag(name: str, value: bool | None) -> list[str]:
    if value is None:
        return []
    return [f"--{name}" if value else f"--no-{name}"]


def _float_text(value: float) -> str:
    return repr(float(value))


def _fail(name: str, message: str) -> None:
    raise ConfigError(f"engine args: {name}: {message}")


def _positive(args: EngineArgs, name: str) -> None:
    value = getattr(args, name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        _fail(name, f"must be a positive integer, got {value!r}")


def _one_of(args: EngineArgs, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(args, name)
    if value is not None and value not in allowed:
        _fail(name, f"{value!r} is not one of {', '.join(allowed)}")


def _validate(args: EngineArgs) -> None:
    if not isinstance(args.model, str) or not args.model.strip():
        _fail("model", "must be a non-empty model name or path")
    if args.served_model_name is not None and not args.served_model_name.strip():
        _fail("served_model_name", "must be non-empty when set")
    if not args.host:
        _fail("host", "must be non-empty")
    if isinstance(args.port, bool) or not isinstance(args.port, int) or not 1 <= args.port <= 65535:
        _fail("port", f"must be in 1..65535, got {args.port!r}")
    _one_of(args, "dtype", DTYPES)
    _one_of(args, "quantization", QUANTIZATIONS)
    _one_of(args, "kv_cache_dtype", KV_CACHE_DTYPES)
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
        _positive(args, name)
    util = args.gpu_memory_utilization
    if util is not None and not 0.0 < util <= 1.0:
        _fail("gpu_memory_utilization", f"must be in (0, 1], got {util!r}")
    if (
        args.max_num_batched_tokens is not None
        and args.max_model_len is not None
        and args.enable_chunked_prefill is False
        and args.max_num_batched_tokens < args.max_model_len
    ):
        _fail(
            "max_num_batched_tokens",
            f"{args.max_num_batched_tokens} < max_model_len {args.max_model_len}: without chunked prefill "
            "a full-length prompt could never be scheduled",
        )
    _validate_speculative(args)
    _validate_lora(args)
    _validate_kv_events(args)
    _validate_extra(args)


def _validate_lora(args: EngineArgs) -> None:
    if not args.enable_lora:
        if args.max_loras is not None or args.max_lora_rank is not None or args.lora_modules:
            _fail("enable_lora", "required when max_loras, max_lora_rank or lora_modules is set")
        return
    _positive(args, "max_loras")
    if args.max_lora_rank is not None and args.max_lora_rank not in LORA_RANKS:
        _fail("max_lora_rank", f"{args.max_lora_rank!r} is not one of vLLM's {', '.join(map(str, LORA_RANKS))}")
    names: set[str] = set()
    for module in args.lora_modules:
        if len(module) != 2 or not all(isinstance(part, str) for part in module):
            _fail("lora_modules", f"expected (name, path) pairs, got {module!r}")
        name, path = module
        if not valid_adapter_name(name) or name in names or name == args.served_model_name:
            _fail("lora_modules", f"adapter name {name!r} is invalid, repeated or the served model's name")
        if not path or any(c.isspace() for c in path):
            _fail("lora_modules", f"adapter {name!r}: path must be non-empty without whitespace")
        names.add(name)


def _bound_address(address: str) -> bool:
    """An address vLLM binds (see `KvEventsArgs`): tcp with a wildcard host and a port, or ipc."""
    if address.startswith("ipc://"):
        return len(address) > len("ipc://") and not any(c.isspace() for c in address)
    if not address.startswith("tcp://") or ("*" not in address and "::" not in address):
        return False
    port = address.rsplit(":", 1)[-1]
    return port.isdigit() and 1 <= int(port) <= 65535


def _validate_kv_events(args: EngineArgs) -> None:
    kv = args.kv_events
    if kv is None:
        return
    if args.enable_prefix_caching is False:
        _fail("kv_events", "KV-cache events need prefix caching (vLLM publishes only cached blocks)")
    for name, address in (("endpoint", kv.endpoint), ("replay_endpoint", kv.replay_endpoint)):
        if address is not None and not _bound_address(address):
            _fail("kv_events", f"{name} {address!r} must be tcp://*:<port> or ipc://<path>: vLLM connects to any "
                  "other address instead of binding it, and no gateway could reach it")
    if kv.replay_endpoint is not None and kv.replay_endpoint == kv.endpoint:
        _fail("kv_events", "replay_endpoint must differ from endpoint")
    if any(c.isspace() for c in kv.topic):
        _fail("kv_events", f"topic {kv.topic!r} must not contain whitespace")
    if kv.buffer_steps is not None and (isinstance(kv.buffer_steps, bool) or kv.buffer_steps < 1):
        _fail("kv_events", f"buffer_steps must be a positive integer, got {kv.buffer_steps!r}")


def _validate_speculative(args: EngineArgs) -> None:
    method = args.speculative_method
    if method is None:
        if args.speculative_model is not None or args.num_speculative_tokens is not None:
            _fail("speculative_method", "required when speculative_model or num_speculative_tokens is set")
        return
    _one_of(args, "speculative_method", SPECULATIVE_METHODS)
    if args.num_speculative_tokens is None:
        _fail("num_speculative_tokens", f"required with speculative_method {method!r}")
    _positive(args, "num_speculative_tokens")
    if method in SPECULATIVE_METHODS_WITH_MODEL and not args.speculative_model:
        _fail("speculative_model", f"speculative_method {method!r} needs a draft/head model")
    if method in SPECULATIVE_METHODS_WITHOUT_MODEL and args.speculative_model is not None:
        _fail("speculative_model", f"speculative_method {method!r} takes no separate model")


def _validate_extra(args: EngineArgs) -> None:
    if isinstance(args.extra_args, str) or not all(isinstance(a, str) for a in args.extra_args):
        _fail("extra_args", "must be a sequence of strings (one argv token each)")
    for token in args.extra_args:
        flag = token.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            _fail("extra_args", f"{flag} is set by a typed field; use that field instead")
