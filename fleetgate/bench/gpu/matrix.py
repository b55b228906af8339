"""The configurations the GPU tier runs, in order of value, each an InferenceService spec.

A configuration proves one or more CRD knobs (`knobs`). It is either expected to start and serve, or to
be refused by the operator's validation (`expect="invalid"`; its `raw_argv` is what the operator would
have rendered without that check, which the sweep's preflight gives to vLLM's own config validation to
show that vLLM refuses it too). Start-up dominates the cost of a configuration (first H100 call, two engines
starting at once: 147-156 s compiled with CUDA graphs, 73-100 s with `enforceEager`, ~55 s of which is
Python importing vLLM in the API server and then in the engine core), so:
- throughput figures (1, 16 and 64 streams) come from compiled configurations (what production runs);
  the compiled 70B also runs the calibration probe (TTFT by prompt length, TPOT by batch: ~20 s), from
  which `fleetgate bench cost --tier-entry large=llama70b-fp8-tp2` fits the large tier's step times;
- knobs and architectures that only need to start, serve and report capacity run with `enforceEager`
  (a CRD field the plan models: no CUDA graph reserve), with one short load level;
- tensor parallelism takes both GPUs, so it runs last (`gpus` = every GPU), and a `group` lists cheaper
  alternatives of which the first that still fits the deadline runs.
`est_start_s` is the expected start-up (the scheduler scales it by what earlier starts took); the runner
waits past it, up to the sweep's deadline, once vLLM's log says the engine is initialised.
`gpu_matrix` is the H100/H200 sweep; `cpu_matrix` is its dry run on vLLM CPU (same code, tiny model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetgate.bench.gpu.models import model_config
from fleetgate.engine.hf_config import arch_facts

Expect = Literal["serve", "invalid"]
RefusedAt = Literal["config", "start"]  # where vLLM refuses: its config check (preflight) or model start-up
FULL_LEVELS: tuple[int, ...] = (1, 16, 64)
COVERAGE_LEVELS: tuple[int, ...] = (16,)
DUMMY = ("--load-format", "dummy")
CPU_START_S = 150.0  # vLLM CPU on a shared two-core machine


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    name: str
    shape: str | None  # the model directory (`models/<shape>.json`); None: a real model's own directory
    spec: Mapping[str, Any]  # the InferenceService spec, model.source already a path
    knobs: tuple[str, ...]
    gpus: int = 1  # GPU slots it takes
    final: bool = False  # runs after the single-slot queues, when every slot is free
    expect: Expect = "serve"
    levels: tuple[int, ...] = COVERAGE_LEVELS  # concurrent streams measured, in order
    rounds: int = 1  # requests per stream at each level (1 stream: 3 requests)
    est_start_s: float = 95.0
    group: str | None = None
    lora_rank: int | None = None  # load a generated adapter of this rank through the runtime API
    calibrate: bool = False  # before the levels, the calibration probe (`load.calibration`) for the cost report
    raw_argv: tuple[str, ...] = ()
    refused_at: RefusedAt = "config"
    sense_check: bool = False  # real weights: one answer must make sense
    note: str = ""

    @property
    def compiled(self) -> bool:
        return not bool(self.spec.get("engine", {}).get("enforceEager", False))


def architecture(shape: str) -> dict[str, Any]:
    """The spec's `model.architecture` for a packaged shape, from its config.json."""
    a = arch_facts(model_config(shape))
    out: dict[str, Any] = {
        "parametersBillions": a.parameters / 1e9, "layers": a.layers, "kvHeads": a.kv_heads, "headDim": a.head_dim,
        "hiddenSize": a.hidden_size, "attentionHeads": a.attention_heads, "vocabSize": a.vocab_size,
        "tiedEmbeddings": a.tied_embeddings, "intermediateSize": a.intermediate_size,
    }  # fmt: skip
    if a.experts_per_token:
        out["expertsPerToken"] = a.experts_per_token
    if a.sliding_window_layers:
        out.update(slidingWindowLayers=a.sliding_window_layers, slidingWindow=a.sliding_window)
    return out


def _spec(
    path: Callable[[str], str],
    shape: str,
    *,
    accelerator: str,
    gpus: int = 1,
    extra: tuple[str, ...] = DUMMY,
    **engine: Any,
) -> dict[str, Any]:
    return {
        "model": {"source": path(shape), "architecture": architecture(shape)},
        "engine": {"maxModelLen": 8192, "extraArgs": list(extra), **engine},
        "resources": {"accelerator": accelerator, "gpus": gpus},
    }  # fmt: skip


def gpu_matrix(*, path: Callable[[str], str], accelerator: str, gemma_dir: str | None = None) -> list[SweepConfig]:
    """The sweep on one or two H100/H200s, highest value first."""

    def spec(shape: str, **engine: Any) -> dict[str, Any]:
        return _spec(path, shape, accelerator=accelerator, **engine)

    eager = {"enforceEager": True}
    draft = {"method": "draft_model", "draftModel": path("draft-llama-0.3b"), "numTokens": 4,
             "draftArchitecture": architecture("draft-llama-0.3b")}  # fmt: skip
    # Held out from the draft-model fit (llama8b-draft-eager): another draft (16 layers, head size 64: a
    # different KV page than the target's), 3 tokens, 256 sequences (the rejection sampler's rows), 0.8.
    draft1b = {"method": "draft_model", "draftModel": path("draft-llama-1b"), "numTokens": 3,
               "draftArchitecture": architecture("draft-llama-1b")}  # fmt: skip
    configs = [
        # Refused by validation (no engine started): vLLM's own check of the raw arguments shows it refuses them too.
        SweepConfig(name="refused-maxnumseqs", shape="llama-3.1-8b", expect="invalid",
                    spec=spec("llama-3.1-8b", maxNumSeqs=16384),
                    knobs=("maxNumSeqs above the step's token budget",),
                    raw_argv=("--max-num-seqs", "16384", "--max-model-len", "8192", *DUMMY)),
        SweepConfig(name="refused-lora-vocab", shape="llama-3.1-8b", expect="invalid", refused_at="start",
                    spec=spec("llama-3.1-8b", maxAdapters=2), knobs=("LoRA on a 262,144-token vocabulary",),
                    raw_argv=("--enable-lora", "--max-loras", "2", "--max-model-len", "8192", *DUMMY)),
        SweepConfig(name="refused-tp3-qwen", shape="qwen2.5-7b", expect="invalid",
                    spec=spec("qwen2.5-7b", tensorParallelSize=3, gpus=3),
                    knobs=("tensorParallelSize not dividing the heads",),
                    raw_argv=("--tensor-parallel-size", "3", "--max-model-len", "8192", *DUMMY)),
        # Compiled with CUDA graphs, as production runs: the capacity baseline of issue 23 and the fp8 pay-off.
        SweepConfig(name="llama8b-bf16", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", dtype="bfloat16", gpuMemoryUtilization=0.9),
                    knobs=("dtype bfloat16", "prefixCaching", "gpuMemoryUtilization 0.9"), levels=FULL_LEVELS, rounds=2,
                    est_start_s=165),
        SweepConfig(name="llama8b-fp8-kvfp8", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", quantization="fp8", kvCacheDtype="fp8", gpuMemoryUtilization=0.9),
                    knobs=("quantization fp8", "kvCacheDtype fp8"), levels=FULL_LEVELS, rounds=2, est_start_s=165),
        # Knob coverage with enforceEager, by what is learnt: the draft-model plan and its held-out check, then
        # architectures the plan has not met (Gemma 3's sliding windows, a MoE on the V1 runner) between knobs.
        SweepConfig(name="llama8b-draft-eager", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", speculative=draft, gpuMemoryUtilization=0.85, **eager),
                    knobs=("speculative draft_model", "draftArchitecture")),
        SweepConfig(name="llama8b-draft1b-eager", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", speculative=draft1b, maxNumSeqs=256, gpuMemoryUtilization=0.8, **eager),
                    knobs=("speculative draft_model (held-out draft)", "maxNumSeqs 256", "gpuMemoryUtilization 0.8")),
        # kvEvents: vLLM 0.26 must accept the rendered --kv-events-config and publish per KV group (Gemma 3 has
        # sliding-window and full-attention groups, which precise prefix routing tells apart).
        SweepConfig(name="gemma3-12b-eager", shape="gemma-3-12b",
                    spec=spec("gemma-3-12b", gpuMemoryUtilization=0.9, kvEvents={}, **eager),
                    knobs=("Gemma 3 architecture", "sliding-window KV groups", "kvEvents (--kv-events-config)")),
        # Llama-3.1-8B's own 128,256-token vocabulary for LoRA: vLLM refuses LoRA above 258,048 (refused-lora-vocab).
        SweepConfig(name="llama8b-lora-eager", shape="llama-3.1-8b-vocab128k",
                    spec=spec("llama-3.1-8b-vocab128k", maxAdapters=4, maxLoraRank=16, gpuMemoryUtilization=0.8,
                              **eager),
                    knobs=("maxAdapters", "maxLoraRank", "runtime adapter load", "enforceEager",
                           "gpuMemoryUtilization 0.8", "vocabulary 128,256"), lora_rank=8),
        SweepConfig(name="mixtral-fp8-eager", shape="mixtral-8x7b",
                    spec=spec("mixtral-8x7b", quantization="fp8", gpuMemoryUtilization=0.92, **eager),
                    knobs=("mixture of experts", "fp8 MoE"), est_start_s=110),
        SweepConfig(name="llama8b-ngram-sched-eager", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", speculative={"method": "ngram", "numTokens": 4}, chunkedPrefill=True,
                              maxNumBatchedTokens=2048, maxNumSeqs=128, prefixCaching=False,
                              gpuMemoryUtilization=0.7, **eager),
                    knobs=("speculative ngram", "chunkedPrefill", "maxNumBatchedTokens", "maxNumSeqs",
                           "prefixCaching off", "gpuMemoryUtilization 0.7")),
        SweepConfig(name="qwen7b-gptq-eager", shape="qwen2.5-7b-gptq",
                    spec=spec("qwen2.5-7b-gptq", quantization="gptq_marlin", gpuMemoryUtilization=0.5, **eager),
                    knobs=("quantization gptq_marlin (4-bit checkpoint)", "Qwen2 architecture",
                           "gpuMemoryUtilization 0.5")),
        SweepConfig(name="llama8b-awq-eager", shape="llama-3.1-8b-awq",
                    spec=spec("llama-3.1-8b-awq", quantization="awq_marlin", gpuMemoryUtilization=0.9, **eager),
                    knobs=("quantization awq_marlin (4-bit checkpoint)",)),
        # fp8_e5m2 served on no H100: vLLM 0.26 died at its first forward pass (its Triton attention asserts an
        # e4m3 KV cache; second call, 2026-11-27), so the Hopper profiles refuse it, and chunked prefill off
        # is proven with e4m3.
        SweepConfig(name="refused-e5m2-hopper", shape="llama-3.1-8b", expect="invalid", refused_at="start",
                    spec=spec("llama-3.1-8b", kvCacheDtype="fp8_e5m2"), knobs=("kvCacheDtype fp8_e5m2 on Hopper",),
                    raw_argv=("--kv-cache-dtype", "fp8_e5m2", "--max-model-len", "8192", *DUMMY)),
        SweepConfig(name="llama8b-nochunk-e4m3-eager", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", chunkedPrefill=False, kvCacheDtype="fp8_e4m3", **eager),
                    knobs=("chunkedPrefill off", "kvCacheDtype fp8_e4m3")),
        SweepConfig(name="llama8b-fp8", shape="llama-3.1-8b",
                    spec=spec("llama-3.1-8b", quantization="fp8", gpuMemoryUtilization=0.9),
                    knobs=("quantization fp8 alone",), levels=FULL_LEVELS, rounds=2, est_start_s=165),
        # Both GPUs: tensor parallelism last; the compiled 70B if it still fits, else eager.
        SweepConfig(name="llama70b-fp8-tp2", shape="llama-3.1-70b", gpus=2, final=True, group="tp2",
                    spec=spec("llama-3.1-70b", quantization="fp8", tensorParallelSize=2, gpus=2,
                              gpuMemoryUtilization=0.9),
                    knobs=("tensorParallelSize 2", "Llama 70B on two GPUs"), levels=FULL_LEVELS, rounds=2,
                    est_start_s=260, calibrate=True),
        SweepConfig(name="llama70b-fp8-tp2-eager", shape="llama-3.1-70b", gpus=2, final=True, group="tp2",
                    spec=spec("llama-3.1-70b", quantization="fp8", tensorParallelSize=2, gpus=2,
                              gpuMemoryUtilization=0.9, **eager),
                    knobs=("tensorParallelSize 2", "Llama 70B on two GPUs"), levels=(1, 16), est_start_s=140),
    ]  # fmt: skip
    if gemma_dir is not None:
        configs.insert(5, real_gemma(gemma_dir=gemma_dir, accelerator=accelerator, gpus=1))
    return configs


def cpu_matrix(*, path: Callable[[str], str], gemma_dir: str | None = None) -> list[SweepConfig]:
    """The dry run on vLLM CPU: the same mechanics on a two-layer model (and Gemma 3 270M when prepared)."""

    def spec(**engine: Any) -> dict[str, Any]:
        return _spec(path, "tiny-llama", accelerator="cpu", gpus=0, maxModelLen=2048, enforceEager=True, **engine)

    configs = [
        SweepConfig(name="cpu-tiny", shape="tiny-llama", spec=spec(), knobs=("dtype auto", "prefixCaching"),
                    levels=(1, 4), est_start_s=CPU_START_S),
        SweepConfig(name="cpu-tiny-lora", shape="tiny-llama", spec=spec(maxAdapters=2, maxLoraRank=8),
                    knobs=("maxAdapters", "runtime adapter load"), lora_rank=8, levels=(2,), est_start_s=CPU_START_S),
        SweepConfig(name="refused-maxnumseqs", shape="tiny-llama", expect="invalid", spec=spec(maxNumSeqs=4096),
                    knobs=("maxNumSeqs above the step's token budget",),
                    raw_argv=("--max-num-seqs", "4096", "--max-model-len", "2048", *DUMMY)),
        SweepConfig(name="cpu-tiny-final", shape="tiny-llama", final=True, group="final",
                    spec=spec(maxNumSeqs=8, chunkedPrefill=True, maxNumBatchedTokens=2048),
                    knobs=("maxNumSeqs", "chunkedPrefill"), levels=(2,), est_start_s=CPU_START_S),
    ]  # fmt: skip
    if gemma_dir is not None:
        configs.append(real_gemma(gemma_dir=gemma_dir, accelerator="cpu", gpus=0))
    return configs


def real_gemma(*, gemma_dir: str, accelerator: str, gpus: int) -> SweepConfig:
    """The packaged Gemma 3 270M with its real weights: one answer is checked for sense."""
    real = {"model": {"source": gemma_dir}, "engine": {"maxModelLen": 2048, "enforceEager": True},
            "resources": {"accelerator": accelerator, "gpus": gpus}}  # fmt: skip
    return SweepConfig(name="gemma3-270m-real", shape=None, spec=real, sense_check=True,
                       knobs=("real weights answer",), levels=(), est_start_s=CPU_START_S)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MatrixChoice:
    """Which configurations to run: `only` (names) when given, minus `skip`."""

    only: frozenset[str] = field(default_factory=frozenset)
    skip: frozenset[str] = field(default_factory=frozenset)

    def select(self, configs: list[SweepConfig]) -> list[SweepConfig]:
        chosen = [c for c in configs if (not self.only or c.name in self.only) and c.name not in self.skip]
        return chosen
