"""From a validated spec to what will run: engine args, model location, accelerator and capacity plan.

Pure: no API calls. The model source decides what vLLM's `--model` receives and which volume holds it:
`hf://org/name` -> `org/name` (downloaded into the model cache volume, `HF_HOME`), `pvc://claim/path` ->
`/models/claim/path` on the claim mounted read-only, `s3://bucket/path` -> streamed by vLLM's Run:ai model
streamer (`--load-format runai_streamer`), an absolute path -> used as is (baked into the image). Weight
bytes for the plan come from the quantization method, else from the dtype.

LoRA adapters (`spec.adapters`) resolve to the `lora_path` vLLM's runtime API loads: `hf://org/name` ->
`org/name` (vLLM downloads it into `HF_HOME`), `pvc://claim/path` -> `/models/claim/path` (the claim is
mounted read-only like the model's), an absolute path as is; `s3://` is refused (vLLM's adapter loader reads
local paths and Hugging Face repositories only). They are not start-up flags: the operator loads them at
runtime (`fleetgate.operator.adapters`), so adding or removing one never changes the pod template.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgate.core.errors import ConfigError
from fleetgate.engine.args import LORA_MAX_VOCAB, EngineArgs, KvEventsArgs
from fleetgate.engine.batch_limits import BatchLimits, batch_problem, effective_limits
from fleetgate.engine.capacity import (
    GIB,
    CapacityInputs,
    CapacityPlan,
    LoraSlots,
    ModelArch,
    plan_capacity,
    tensor_parallel_problem,
)
from fleetgate.engine.catalog import lookup
from fleetgate.engine.kube_names import ENGINE_PORT
from fleetgate.engine.pod_paths import MODELS_MOUNT, adapter_load_path, pvc_claim
from fleetgate.engine.reserve import Reserve, ReserveInputs, vllm_reserve
from fleetgate.operator.profiles import AcceleratorProfile, Profiles
from fleetgate.operator.spec import Architecture, InferenceServiceSpec, KvEvents, served_name


@dataclass(frozen=True, kw_only=True)
class ModelLocation:
    model_arg: str
    pvc_claim: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ResolvedAdapter:
    name: str
    path: str  # what vLLM's load API receives as lora_path
    pvc_claim: str | None = None


@dataclass(frozen=True, kw_only=True)
class Resolved:
    name: str
    served_model: str
    location: ModelLocation
    engine_args: EngineArgs
    profile: AcceleratorProfile
    plan: CapacityPlan | None
    plan_note: str  # why there is no plan, or the plan's own reason
    adapters: tuple[ResolvedAdapter, ...] = ()

    def volume_claims(self) -> tuple[str, ...]:
        """PVCs the engine pods mount read-only: the model's and the adapters' (sorted, no repeats)."""
        claims = {a.pvc_claim for a in self.adapters} | {self.location.pvc_claim}
        return tuple(sorted(c for c in claims if c))


def locate_model(*, source: str, revision: str | None = None) -> ModelLocation:
    if source.startswith("hf://"):
        extra = ("--revision", revision) if revision else ()
        return ModelLocation(model_arg=source.removeprefix("hf://"), extra_args=extra)
    if source.startswith("pvc://"):
        claim, _, path = source.removeprefix("pvc://").partition("/")
        return ModelLocation(model_arg=f"{MODELS_MOUNT}/{claim}/{path}".rstrip("/"), pvc_claim=claim)
    if source.startswith("s3://"):
        return ModelLocation(model_arg=source, extra_args=("--load-format", "runai_streamer"))
    if source.startswith("/"):
        return ModelLocation(model_arg=source)
    raise ConfigError(f"model source {source!r}: expected hf://, s3://, pvc:// or an absolute path")


def resolve_adapters(*, spec: InferenceServiceSpec, name: str) -> tuple[ResolvedAdapter, ...]:
    served = served_name(spec=spec, name=name)
    out = []
    for adapter in spec.adapters:
        if adapter.name == served:
            raise ConfigError(f"adapters: {adapter.name!r} is the served model's name; an adapter needs its own")
        path = adapter_load_path(source=adapter.source)
        if path is None:
            raise ConfigError(
                f"adapters: {adapter.name!r}: {adapter.source.split('://')[0]}:// sources cannot be loaded by vLLM's "
                "runtime adapter API; use hf://, pvc:// or a path in the engine image"
            )
        out.append(ResolvedAdapter(name=adapter.name, path=path, pvc_claim=pvc_claim(source=adapter.source)))
    return tuple(out)


def _arch(facts: Architecture | None, reference: str | None) -> ModelArch | None:
    if facts is not None:
        return ModelArch(
            parameters=facts.parameters_billions * 1e9,
            layers=facts.layers,
            kv_heads=facts.kv_heads,
            head_dim=facts.head_dim,
            hidden_size=facts.hidden_size,
            attention_heads=facts.attention_heads,
            vocab_size=facts.vocab_size,
            tied_embeddings=facts.tied_embeddings,
            intermediate_size=facts.intermediate_size,
            experts_per_token=facts.experts_per_token,
            sliding_window_layers=facts.sliding_window_layers or 0,
            sliding_window=facts.sliding_window if facts.sliding_window_layers else None,
        )
    return lookup(reference) if reference else None


def engine_args_for(*, spec: InferenceServiceSpec, name: str) -> EngineArgs:
    engine = spec.engine
    location = locate_model(source=spec.model.source, revision=spec.model.revision)
    spec_args = engine.speculative
    return EngineArgs(
        model=location.model_arg,
        served_model_name=served_name(spec=spec, name=name),
        host="0.0.0.0",  # in a pod: the kubelet's probes and the Service reach the pod IP
        port=ENGINE_PORT,
        dtype=engine.dtype,
        quantization=None if engine.quantization == "none" else engine.quantization,
        kv_cache_dtype=engine.kv_cache_dtype,
        max_model_len=engine.max_model_len,
        enable_prefix_caching=engine.prefix_caching,
        enable_chunked_prefill=engine.chunked_prefill,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        tensor_parallel_size=engine.tensor_parallel_size,
        speculative_method=spec_args.method if spec_args else None,
        speculative_model=spec_args.draft_model if spec_args else None,
        num_speculative_tokens=spec_args.num_tokens if spec_args else None,
        enforce_eager=engine.enforce_eager,
        # Adapters themselves are left to the runtime API (no --lora-modules): the pod template, and so its
        # hash, stays the same when adapters are added or removed.
        enable_lora=spec.lora_enabled,
        max_loras=engine.max_adapters if spec.lora_enabled else None,
        max_lora_rank=engine.max_lora_rank if spec.lora_enabled else None,
        kv_events=_kv_events_args(engine.kv_events),
        extra_args=(*location.extra_args, *engine.extra_args),
    )


def _kv_events_args(kv: KvEvents | None) -> KvEventsArgs | None:
    """The pod binds both ports on every interface; gateways connect to the pod IP (discovery's named ports)."""
    if kv is None:
        return None
    return KvEventsArgs(endpoint=f"tcp://*:{kv.port}", replay_endpoint=f"tcp://*:{kv.replay_port}", topic=kv.topic,
                        buffer_steps=kv.buffer_steps)


def pipeline_parallel_size(extra_args: list[str]) -> int:
    """`--pipeline-parallel-size N` / `-pp N` / `--pipeline-parallel-size=N` from raw engine flags (default 1)."""
    for i, arg in enumerate(extra_args):
        flag, eq, value = arg.partition("=")
        if flag in ("--pipeline-parallel-size", "-pp"):
            raw = value if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            try:
                return max(1, int(raw))
            except ValueError:
                raise ConfigError(f"engine.extraArgs: {flag} needs an integer, got {raw!r}") from None
    return 1


def _check_parallelism(*, spec: InferenceServiceSpec, arch: ModelArch | None, gpu: bool) -> None:
    """What vLLM would refuse at start-up, refused here instead (no pods that crash-loop or idle a GPU)."""
    tp = spec.engine.tensor_parallel_size
    if gpu:
        pp = pipeline_parallel_size(spec.engine.extra_args)
        if spec.resources.gpus != tp * pp:
            raise ConfigError(
                f"resources.gpus is {spec.resources.gpus} but vLLM uses tensorParallelSize x pipeline parallel size "
                f"= {tp} x {pp} = {tp * pp} GPUs per replica: set resources.gpus to {tp * pp}"
            )
    if arch is not None:
        problem = tensor_parallel_problem(arch=arch, tensor_parallel_size=tp)
        if problem is not None:
            raise ConfigError(f"engine.{problem}: vLLM would refuse to start")


def _check_lora(*, spec: InferenceServiceSpec, arch: ModelArch | None) -> None:
    """LoRA on a model with a separate lm_head and more than LORA_MAX_VOCAB tokens: vLLM refuses to start.
    A tied embedding is let through: Gemma computes logits from it without an lm_head module, which vLLM
    does not wrap (Gemma 3, 262,144 tokens, serves LoRA adapters)."""
    if not spec.lora_enabled or arch is None or not arch.vocab_size or arch.tied_embeddings:
        return
    if arch.vocab_size > LORA_MAX_VOCAB:
        raise ConfigError(
            f"LoRA (adapters or engine.maxAdapters) on a model with a {arch.vocab_size}-token vocabulary and its own "
            f"lm_head: vLLM refuses LoRA above {LORA_MAX_VOCAB} tokens"
        )


def _lora_slots(*, args: EngineArgs, dtype: str) -> LoraSlots | None:
    """vLLM's LoRA slots; LoRA weights take the activation dtype (16-bit unless the model runs in float32)."""
    slots = args.lora_slots()
    if slots is None:
        return None
    return LoraSlots(max_loras=slots[0], max_lora_rank=slots[1], dtype_bytes=4.0 if dtype == "float32" else 2.0)


# The flat per-GPU reserve used when a GPU profile sets none and the model's hidden size is unknown.
FLAT_OVERHEAD_BYTES = 2 * 10**9


def batch_limits(*, spec: InferenceServiceSpec, profile: AcceleratorProfile) -> BatchLimits:
    """The max_num_batched_tokens and max_num_seqs vLLM will run this spec with on this accelerator."""
    engine = spec.engine
    return effective_limits(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        chunked_prefill=engine.chunked_prefill,
        max_model_len=engine.max_model_len,
        default_seqs=profile.max_num_seqs,
        default_tokens=profile.max_num_batched_tokens,
    )


def reserve_for(
    *, spec: InferenceServiceSpec, profile: AcceleratorProfile, arch: ModelArch, limits: BatchLimits
) -> Reserve | None:
    """vLLM's modelled per-GPU reserve, or None where the profile gives a flat one or the model's hidden
    size is unknown (then `FLAT_OVERHEAD_BYTES`)."""
    if not profile.is_gpu or profile.overhead_bytes is not None or not arch.hidden_size:
        return None
    speculative = spec.engine.speculative
    inputs = ReserveInputs(
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_num_seqs=limits.max_num_seqs,
        enforce_eager=spec.engine.enforce_eager,
        activation_dtype_bytes=4.0 if spec.engine.dtype == "float32" else 2.0,
        num_speculative_tokens=speculative.num_tokens if speculative is not None else 0,
        speculative_method=speculative.method if speculative is not None else None,
    )
    return vllm_reserve(arch=arch, inputs=inputs, tensor_parallel_size=spec.engine.tensor_parallel_size)


def resolve(*, spec: InferenceServiceSpec, name: str, profiles: Profiles) -> Resolved:
    """Everything the builders and the status need; raises ConfigError for an unusable spec."""
    profile = profiles.resolve(name=spec.resources.accelerator)
    if profile.is_gpu and spec.resources.gpus == 0:
        raise ConfigError(f"accelerator {profile.name!r} is a GPU profile but resources.gpus is 0")
    if not profile.is_gpu and spec.resources.gpus > 0:
        raise ConfigError(f"accelerator {profile.name!r} has no GPUs; set resources.gpus to 0")
    accepted = profile.kv_cache_dtypes
    if accepted is not None and spec.engine.kv_cache_dtype not in accepted:
        raise ConfigError(
            f"accelerator {profile.name!r} does not accept kvCacheDtype {spec.engine.kv_cache_dtype!r}; "
            f"it accepts {', '.join(accepted)}"
            + (" (on Hopper vLLM's attention takes an fp8 KV cache as e4m3 only and fails at start-up on e5m2: use fp8)"
               if spec.engine.kv_cache_dtype == "fp8_e5m2" and profile.is_gpu else "")
        )
    args = engine_args_for(spec=spec, name=name)
    adapters = resolve_adapters(spec=spec, name=name)
    arch = _arch(spec.model.architecture, spec.model.source)
    _check_parallelism(spec=spec, arch=arch, gpu=profile.is_gpu)
    _check_lora(spec=spec, arch=arch)
    limits = batch_limits(spec=spec, profile=profile)
    problem = batch_problem(limits)
    if problem is not None:
        raise ConfigError(f"engine.{problem}")
    plan: CapacityPlan | None = None
    if not profile.is_gpu and profile.kv_cache_space_gib == 0:
        note = f"no capacity plan: CPU profile {profile.name!r} gives no kv_cache_space_gib"
    elif arch is None:
        note = (
            f"model {spec.model.source!r} is not in the built-in catalog: set spec.model.architecture "
            "(parametersBillions, layers, kvHeads, headDim) for a capacity plan"
        )
    else:
        draft_arch = None
        speculative = spec.engine.speculative
        if speculative is not None and speculative.draft_model:
            draft_arch = _arch(speculative.draft_architecture, speculative.draft_model)
        reserve = reserve_for(spec=spec, profile=profile, arch=arch, limits=limits)
        flat = profile.overhead_bytes if profile.overhead_bytes is not None else FLAT_OVERHEAD_BYTES
        plan = plan_capacity(
            inputs=CapacityInputs(
                arch=arch,
                weight_dtype=spec.engine.quantization if spec.engine.quantization != "none" else spec.engine.dtype,
                kv_cache_dtype=spec.engine.kv_cache_dtype,
                tensor_parallel_size=spec.engine.tensor_parallel_size,
                gpu_memory_bytes=profile.gpu_memory_bytes,
                gpu_memory_utilization=spec.engine.gpu_memory_utilization,
                overhead_bytes=flat,
                reserve=reserve,
                max_model_len=spec.engine.max_model_len,
                target_concurrency=spec.engine.max_num_seqs,
                draft=draft_arch,
                kv_cache_bytes=None if profile.is_gpu else profile.kv_cache_space_gib * GIB,
                block_size=profile.kv_block_size,
                max_num_batched_tokens=limits.max_num_batched_tokens,
                lora=_lora_slots(args=args, dtype=spec.engine.dtype),
            )
        )
        note = plan.reason
        if profile.is_gpu and reserve is None and profile.overhead_bytes is None:
            note += "; a flat 2 GB reserve: set architecture.hiddenSize to model activations and CUDA graphs"
        if speculative is not None and speculative.draft_model and draft_arch is None:
            note += "; draft model not in the catalog: its memory is not counted (set draftArchitecture)"
    return Resolved(
        name=name,
        served_model=served_name(spec=spec, name=name),
        location=locate_model(source=spec.model.source, revision=spec.model.revision),
        engine_args=args,
        profile=profile,
        plan=plan,
        plan_note=note,
        adapters=adapters,
    )
