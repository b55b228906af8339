"""The typed `InferenceService` spec (fleetgate.io/v1alpha1): validated here and rendered into the CRD.

One set of pydantic models serves three purposes: the operator validates every CR with them, `crd.py`
derives the CRD's structural OpenAPI schema from them (defaults, enums, bounds and the CEL rules given in
`x-kubernetes-validations`), and `fleetgate plan` reads spec files with them. Field names are camelCase
on the wire (Kubernetes convention), snake_case in Python. Every CEL rule has a twin `model_validator`
here, so the operator rejects what the API server would reject even where CEL is not enforced.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from fleetgate.core.adapters import ADAPTER_NAME_MAX, ADAPTER_NAME_PATTERN
from fleetgate.engine.args import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS
from fleetgate.engine.kube_names import ENGINE_PORT, GROUP, KIND, KV_EVENTS_DEFAULT_TOPIC, PLURAL, VERSION
from fleetgate.operator.spec_base import Model, empty_default, rules
from fleetgate.operator.spec_pod import PodSettings

__all__ = [
    "GROUP", "KIND", "PLURAL", "VERSION", "InferenceServiceSpec", "parse_spec", "served_name", "validation_message",
]

SINGULAR = "inferenceservice"
SHORT_NAMES = ("fgis", "fgisvc")  # not `isvc`: KServe owns that short name for its own InferenceService

Quantization = Literal["none", "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors", "bitsandbytes"]
Dtype = Literal["auto", "float16", "bfloat16", "float32"]
KvCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]  # vLLM 0.32's `MaxLoRARanks`
SpeculativeMethod = Literal["ngram", "suffix", "mtp", "draft_model", "eagle", "eagle3", "medusa"]
MODEL_SOURCE_PATTERN = (
    r"^(hf://[^/\s]+/[^\s]+|s3://[^/\s]+/[^\s]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^\s]*)?|/[^\s]+)$"
)
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"


# The shared base and CEL/default helpers live in spec_base (spec_pod.py uses them too).
_rules = rules
_empty_default = empty_default
_Model = Model


class Architecture(_Model):
    """Model architecture facts for the capacity plan (from the model's config.json)."""

    parameters_billions: float = Field(gt=0, le=10000, description="Parameter count in billions.")
    layers: int = Field(ge=1, le=1000, description="num_hidden_layers")
    kv_heads: int = Field(ge=1, le=1024, description="num_key_value_heads")
    head_dim: int = Field(ge=1, le=4096, description="Attention head dimension.")
    hidden_size: int | None = Field(default=None, ge=1, description="hidden_size.")
    attention_heads: int | None = Field(
        default=None, ge=1, le=4096, description="num_attention_heads (default hiddenSize / headDim)."
    )
    vocab_size: int | None = Field(
        default=None, ge=1, description="vocab_size: 4-bit checkpoints keep embeddings and lm_head in 16 bits."
    )
    tied_embeddings: bool = Field(default=False, description="tie_word_embeddings.")
    intermediate_size: int | None = Field(
        default=None, ge=1, description="intermediate_size (one expert's for a mixture of experts): sizes activations."
    )
    experts_per_token: int | None = Field(
        default=None, ge=1, le=1024, description="num_experts_per_tok of a mixture-of-experts model."
    )
    sliding_window_layers: int | None = Field(
        default=None, ge=0, le=1000, description="Layers that attend only to the last slidingWindow tokens (Gemma 3)."
    )
    sliding_window: int | None = Field(default=None, ge=1, description="sliding_window, in tokens.")

    @model_validator(mode="after")
    def _window(self) -> Architecture:
        if self.sliding_window_layers and self.sliding_window is None:
            raise ValueError("slidingWindowLayers needs slidingWindow")
        if (self.sliding_window_layers or 0) > self.layers:
            raise ValueError("slidingWindowLayers exceeds layers")
        return self


class ModelSource(_Model):
    """The model to serve: where its weights are, the name clients send, and what the capacity plan needs."""

    source: str = Field(
        pattern=MODEL_SOURCE_PATTERN,
        max_length=1024,
        description="hf://org/name, s3://bucket/path, pvc://claim/path, or a path inside the engine image.",
    )
    served_name: str | None = Field(
        default=None, max_length=253, description="Model name clients send; defaults to the resource name."
    )
    revision: str | None = Field(default=None, max_length=128, description="Hugging Face revision (hf:// only).")
    credentials_secret: str | None = Field(
        default=None,
        max_length=253,
        description="Secret whose keys become engine env vars (HF_TOKEN for gated models, AWS_* for s3://).",
    )
    cache_size: str = Field(default="100Gi", pattern=QUANTITY_PATTERN, description="Size limit of the model cache.")
    architecture: Architecture | None = Field(
        default=None, description="Architecture facts; the built-in catalog is used when omitted."
    )


class Speculative(_Model):
    """Speculative decoding (vLLM --speculative-config): a method and, for some methods, a draft model."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!(self.method in ['draft_model', 'eagle', 'eagle3', 'medusa']) || has(self.draftModel)",
                "this speculative method needs draftModel",
            ),
            (
                "!(self.method in ['ngram', 'suffix', 'mtp']) || !has(self.draftModel)",
                "this speculative method takes no draftModel",
            ),
        )
    )
    method: SpeculativeMethod = Field(description="vLLM speculative method.")
    draft_model: str | None = Field(default=None, max_length=1024, description="Draft or head model reference.")
    num_tokens: int = Field(default=4, ge=1, le=16, description="Tokens proposed per step.")
    draft_architecture: Architecture | None = Field(default=None, description="Draft model facts for the plan.")

    @model_validator(mode="after")
    def _draft_matches_method(self) -> Speculative:
        needs = self.method in ("draft_model", "eagle", "eagle3", "medusa")
        if needs and not self.draft_model:
            raise ValueError(f"speculative method {self.method!r} needs draftModel")
        if not needs and self.draft_model:
            raise ValueError(f"speculative method {self.method!r} takes no draftModel")
        return self


class KvEvents(_Model):
    """Publish KV-cache events (vLLM --kv-events-config) for the gateway's precise prefix routing."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.port != self.replayPort", "kvEvents.port and replayPort must differ"),
            (f"self.port != {ENGINE_PORT} && self.replayPort != {ENGINE_PORT}",
             f"kvEvents ports must differ from the engine's HTTP port {ENGINE_PORT}"),
        )
    )
    port: int = Field(default=5557, ge=1024, le=65535, description="ZMQ PUB port the gateways subscribe to.")
    replay_port: int = Field(
        default=5558, ge=1024, le=65535, description="ZMQ replay port: a gateway that missed events asks it for them."
    )
    topic: str = Field(
        default=KV_EVENTS_DEFAULT_TOPIC, max_length=64, pattern=r"^[A-Za-z0-9._@/-]*$", description="Event topic."
    )
    buffer_steps: int = Field(default=10000, ge=1, le=1_000_000, description="Event batches kept for replay.")

    @model_validator(mode="after")
    def _distinct_ports(self) -> KvEvents:
        if self.port == self.replay_port:
            raise ValueError("kvEvents.port and replayPort must differ")
        if ENGINE_PORT in (self.port, self.replay_port):
            raise ValueError(f"kvEvents ports must differ from the engine's HTTP port {ENGINE_PORT}")
        return self


class Engine(_Model):
    """vLLM engine settings, rendered into its command-line flags (typed knobs instead of raw flags)."""

    model_config = ConfigDict(
        json_schema_extra=rules(("!has(self.kvEvents) || self.prefixCaching",
                                  "engine.kvEvents needs engine.prefixCaching (vLLM publishes only cached blocks)"))
    )
    image: str | None = Field(default=None, max_length=512, description="Engine image; the operator default if unset.")
    dtype: Dtype = Field(default="auto", description="Weight and activation dtype (vLLM --dtype).")
    quantization: Quantization = Field(default="none", description="Weight quantization of the checkpoint.")
    kv_cache_dtype: KvCacheDtype = Field(
        default="auto",
        description="KV-cache dtype (vLLM --kv-cache-dtype). The H100 and H200 profiles refuse fp8_e5m2 "
        "(vLLM 0.26 fails at start-up with it on an H100); fp8 is e4m3.",
    )
    max_model_len: int = Field(default=8192, ge=16, le=10_000_000, description="Always set, so the plan is exact.")
    prefix_caching: bool = Field(default=True, description="Automatic prefix caching (--enable-prefix-caching).")
    chunked_prefill: bool | None = Field(default=None, description="Unset: vLLM's default for the model.")
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536, description="Concurrency the plan must fit.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per scheduler step (--max-num-batched-tokens); vLLM's default if unset."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of each GPU's memory vLLM may use (--gpu-memory-utilization)."
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="GPUs one model copy is split over (--tensor-parallel-size)."
    )
    speculative: Speculative | None = Field(default=None, description="Speculative decoding; off when unset.")
    enforce_eager: bool = Field(default=False, description="No CUDA graphs (--enforce-eager): less memory, slower.")
    max_adapters: int | None = Field(
        default=None, ge=1, le=256,
        description=f"LoRA adapters in one batch (vLLM --max-loras; {DEFAULT_MAX_LORAS} when unset and LoRA is on). "
        "Setting it turns LoRA on even without spec.adapters, so adding the first adapter needs no restart.",
    )  # fmt: skip
    max_lora_rank: MaxLoraRank | None = Field(
        default=None,
        description=f"Largest LoRA rank served (vLLM --max-lora-rank; {DEFAULT_MAX_LORA_RANK} when unset).",
    )
    kv_events: KvEvents | None = Field(
        default=None, description="Publish KV-cache events for precise prefix routing (needs prefixCaching)."
    )
    extra_args: list[str] = Field(default_factory=list, max_length=64, description="Raw vLLM flags, appended.")

    @model_validator(mode="after")
    def _kv_events_need_prefix_caching(self) -> Engine:
        if self.kv_events is not None and not self.prefix_caching:
            raise ValueError("engine.kvEvents needs engine.prefixCaching (vLLM publishes only cached blocks)")
        return self


class Resources(_Model):
    """What one engine replica gets: an accelerator profile, GPUs, CPU and memory."""

    accelerator: str | None = Field(
        default=None, max_length=63, description="Accelerator profile name; the operator's default when unset."
    )
    gpus: int = Field(
        default=1, ge=0, le=64,
        description="GPUs per replica: tensorParallelSize x --pipeline-parallel-size (from extraArgs, default 1).",
    )  # fmt: skip
    cpu: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, description="CPU request per replica (default 4 per GPU)."
    )
    memory: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, description="Memory request and limit per replica (16Gi per GPU)."
    )


class Autoscaling(_Model):
    """An HPA (or a KEDA ScaledObject when KEDA is installed) on vLLM's metrics; it owns the replica count."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas"),
            ("self.minReplicas > 0 || self.scaleToZero", "minReplicas 0 requires scaleToZero"),
        )
    )
    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest replicas (0 needs scaleToZero).")
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    metric: Literal["queueDepth", "kvCacheUsage"] = Field(
        default="queueDepth", description="queueDepth (vllm:num_requests_waiting) or kvCacheUsage (KV-cache use)."
    )
    target_queue_depth: float = Field(default=4, gt=0, description="Waiting requests per pod (queueDepth).")
    target_kv_cache_usage: float = Field(default=0.8, gt=0, le=1, description="KV-cache use per pod (kvCacheUsage).")
    scale_to_zero: bool = Field(default=False, description="Allow minReplicas 0 (KEDA wakes it on its metric).")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be <= maxReplicas")
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ValueError("minReplicas 0 requires scaleToZero")
        return self


class Pricing(_Model):
    """Prices the gateway charges tenants for this model (cost accounting and budgets)."""

    input_per_million_tokens: float = Field(ge=0, description="Price of one million prompt tokens.")
    output_per_million_tokens: float = Field(ge=0, description="Price of one million generated tokens.")
    cached_input_per_million_tokens: float | None = Field(
        default=None, ge=0, description="Price of one million prompt tokens served from the prefix cache."
    )


class Gateway(_Model):
    """How the gateway offers this model: its tier and prices."""

    tier: str | None = Field(default=None, max_length=63, description="Tier name for the gateway's tier router.")
    pricing: Pricing | None = Field(default=None, description="Per-token prices; none when unset.")


class Adapter(_Model):
    """A LoRA adapter on the served model: loaded into every engine pod at runtime, served under `name`."""

    name: str = Field(
        pattern=ADAPTER_NAME_PATTERN, max_length=ADAPTER_NAME_MAX,
        description="Model name clients send for this adapter (unique; not the served model's name).",
    )  # fmt: skip
    source: str = Field(
        pattern=MODEL_SOURCE_PATTERN,
        max_length=1024,
        description="hf://org/name, pvc://claim/path or a path inside the engine image (s3:// is refused: "
        "vLLM's runtime adapter API cannot read it).",
    )
    rank: int | None = Field(default=None, ge=1, le=512, description="LoRA rank r; at most engine.maxLoraRank.")
    tenant: str | None = Field(
        default=None, max_length=253, description="The only tenant allowed to use it; every tenant when unset."
    )


_ADAPTER_RULES = (
    (
        "!has(self.adapters) || !has(self.model.servedName) || self.adapters.all(a, a.name != self.model.servedName)",
        "an adapter name must differ from model.servedName",
    ),
    (
        "!has(self.adapters) || self.adapters.all(a, !has(a.rank) || a.rank <= "
        f"(has(self.engine.maxLoraRank) ? self.engine.maxLoraRank : {DEFAULT_MAX_LORA_RANK}))",
        "an adapter's rank exceeds engine.maxLoraRank",
    ),
)


def _adapter_list(schema: dict[str, Any]) -> None:
    """A map list keyed by name: the API server itself refuses two adapters of one name."""
    schema["x-kubernetes-list-type"] = "map"
    schema["x-kubernetes-list-map-keys"] = ["name"]


class InferenceServiceSpec(_Model):
    """What to serve and how: the model, the engine, resources, replicas or autoscaling, LoRA adapters."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.resources.gpus == 0 || self.resources.gpus % self.engine.tensorParallelSize == 0",
             "resources.gpus must be a multiple of engine.tensorParallelSize (tensor x pipeline parallel size)"),
            ("!has(self.autoscaling) || !has(self.replicas) || self.autoscaling.minReplicas <= self.replicas",
             "replicas must be >= autoscaling.minReplicas"),
            ("!has(self.scaleToZeroAfterSeconds) || !has(self.autoscaling)",
             "scaleToZeroAfterSeconds is for a fixed replica count; with autoscaling, the autoscaler owns replicas"),
            *_ADAPTER_RULES,
        )
    )  # fmt: skip
    model: ModelSource
    engine: Engine = Field(default_factory=Engine, json_schema_extra=_empty_default)
    resources: Resources = Field(default_factory=Resources, json_schema_extra=_empty_default)
    pod: PodSettings = Field(
        default_factory=PodSettings, json_schema_extra=_empty_default,
        description="Engine pod settings (security context, ServiceAccount, scheduling, labels) over defaults "
        "that meet the restricted Pod Security Standard.",
    )  # fmt: skip
    replicas: int = Field(
        default=1, ge=0, le=1000, description="Engine replicas; with autoscaling, its floor (kubectl scale)."
    )
    autoscaling: Autoscaling | None = Field(default=None, description="Autoscale on vLLM metrics; fixed when unset.")
    scale_to_zero_after_seconds: int | None = Field(
        default=None, ge=60, le=30 * 86400,
        description="Idle time after which the operator scales the service to zero; a request through the gateway "
        "wakes it (scale from zero). Not with autoscaling.",
    )  # fmt: skip
    gateway: Gateway = Field(default_factory=Gateway, json_schema_extra=_empty_default)
    adapters: list[Adapter] = Field(
        default_factory=list, max_length=256, json_schema_extra=_adapter_list,
        description="LoRA adapters served on this model, loaded and unloaded at runtime (no pod restart).",
    )  # fmt: skip

    @property
    def lora_enabled(self) -> bool:
        """vLLM runs with --enable-lora: adapters are listed, or engine.maxAdapters keeps LoRA on without any."""
        return bool(self.adapters) or self.engine.max_adapters is not None

    @model_validator(mode="after")
    def _cross_fields(self) -> InferenceServiceSpec:
        if self.resources.gpus and self.resources.gpus % self.engine.tensor_parallel_size:
            raise ValueError(
                "resources.gpus must be a multiple of engine.tensorParallelSize (tensor x pipeline parallel size)"
            )
        if self.autoscaling is not None and self.replicas < self.autoscaling.min_replicas:
            raise ValueError("replicas must be >= autoscaling.minReplicas")
        if self.scale_to_zero_after_seconds is not None and self.autoscaling is not None:
            raise ValueError(
                "scaleToZeroAfterSeconds is for a fixed replica count; with autoscaling, the autoscaler owns replicas"
            )
        self._check_adapters()
        return self

    def _check_adapters(self) -> None:
        names = [a.name for a in self.adapters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"adapters: duplicate name(s) {', '.join(duplicates)}")
        if self.model.served_name is not None and self.model.served_name in names:
            raise ValueError("an adapter name must differ from model.servedName")
        limit = self.engine.max_lora_rank or DEFAULT_MAX_LORA_RANK
        for adapter in self.adapters:
            if adapter.rank is not None and adapter.rank > limit:
                raise ValueError(
                    f"an adapter's rank exceeds engine.maxLoraRank: {adapter.name!r} has rank {adapter.rank} > {limit}"
                )


def parse_spec(data: Any) -> InferenceServiceSpec:
    """Validate a CR's `spec` mapping; raises pydantic.ValidationError with field paths."""
    return InferenceServiceSpec.model_validate(data)


def validation_message(exc: ValidationError) -> str:
    """One line naming each invalid field (`spec.engine.maxNumSeqs: ...`), for status and Events."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "spec"
        parts.append(f"spec.{where}: {err.get('msg')}")
    return "; ".join(parts)


def served_name(*, spec: InferenceServiceSpec, name: str) -> str:
    return spec.model.served_name or name
