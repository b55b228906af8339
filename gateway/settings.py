"""The gateway's configuration: one YAML file loaded into `GatewaySettings`.

Load it with `fleetgate.core.config.load_model(GatewaySettings, path)`; with no file the embedded
defaults below apply (a gateway on 127.0.0.1:8080 with no models, auth off, caching off).

The `routing`, `cache`, `tiers` and `tenancy` sections belong to the stages that read them; they are
plain mappings here until those stages replace them with their own typed configs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetgate.cache.config import CacheConfig
from fleetgate.core.adapters import ADAPTER_NAME_MAX, AdapterSpec, valid_adapter_name
from fleetgate.gateway.api_settings import ResponsesSettings
from fleetgate.gateway.prompt_bound import PromptProfile
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.router.config import RoutingConfig
from fleetgate.router.tiers.config import TierConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScaleFromZeroSettings(_Strict):
    """Requests for a model scaled to zero are held while the gateway scales it up (`fleetgate.gateway.wake`)."""

    enabled: bool = Field(default=True, description="hold and wake; off: such requests get 503 at once")
    wait_s: float = Field(default=120.0, gt=0, description="longest a request is held for a first ready endpoint")
    max_held_per_model: int = Field(default=256, ge=1, description="held requests per model; more get 503 at once")
    retry_after_s: int = Field(default=10, ge=1, description="Retry-After of a 503 for a model with no endpoint")
    poll_s: float = Field(default=0.25, gt=0, description="how often a wait checks discovery for a ready endpoint")
    active_mark_s: float = Field(
        default=30.0, gt=0, description="a model's last-request annotation is written at most this often"
    )


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="413 above this request size")
    # Slow clients must not hold connections: a request's headers and its body each have a deadline.
    header_timeout_s: float = Field(default=10.0, gt=0, description="connection open -> request headers complete")
    body_timeout_s: float = Field(default=30.0, gt=0, description="request headers -> whole body received (408)")
    # Prometheus metrics show every tenant's spend: they are served on their own port, never the client one.
    metrics_port: int | None = Field(
        default=9464, ge=0, le=65535, description="/metrics listener (0: any free port; null: no metrics listener)"
    )
    metrics_host: str | None = Field(default=None, description="/metrics listen address (default: host)")
    connect_timeout_s: float = Field(default=3.0, gt=0, description="TCP connect to an engine")
    first_byte_timeout_s: float = Field(
        default=300.0, gt=0, description="request sent -> response headers and, when streaming, the first chunk"
    )
    inter_chunk_timeout_s: float = Field(default=60.0, gt=0, description="longest silence between two stream chunks")
    request_timeout_s: float = Field(default=600.0, gt=0, description="whole non-streaming engine call")
    stream_deadline_s: float = Field(
        default=1800.0, gt=0, description="whole streamed response; past it the stream ends with an error event"
    )
    # On SIGTERM: stop accepting, let requests in flight finish for up to drain_s, then end the streams still
    # open (an error event, [DONE]; settled and recorded) and give them drain_close_s to flush. Keep
    # drain_s + drain_close_s + a few seconds for settling under the pod's grace period (the chart checks).
    drain_s: float = Field(default=40.0, ge=0, description="on SIGTERM: longest wait for requests in flight")
    drain_close_s: float = Field(default=3.0, gt=0, description="then: longest wait for ended streams to flush")
    # Then one deadline for every settle and record write still under way (they run concurrently, one task per
    # request): a stalled Redis costs this at most, not a store timeout per write. What is not confirmed by then is
    # logged per request (tenant, tokens) and counted (`fleetgate_unwritten_*`); it is not spooled anywhere.
    settle_s: float = Field(default=4.0, gt=0, description="then: longest wait for the settle and record writes of "
                            "finished requests; usage not written by then is logged and counted as unwritten")
    cancel_drain_s: float = Field(
        default=2.0, ge=0, description="a client that leaves a stream mid-answer: read the engine's stream to its "
        "next chunk, half-close and read what it sent, at most this long, so the tokens it counted are charged "
        "(0: hang up at once)"
    )
    cancel_finish_tokens: int = Field(
        default=0, ge=0, description="a client that leaves a stream with at most this many of its reserved completion "
        "tokens still to come: let the engine finish (no abort), so the charge is exactly the engine's count "
        "(0: always abort; an abort can leave the tokens of the engine's step in flight uncharged); chat, "
        "completions, Responses and Messages streams alike"
    )
    adapter_load_timeout_s: float = Field(
        default=30.0, gt=0, description="longest a request waits for an engine to load its LoRA adapter on demand"
    )
    keepalive_timeout_s: float = Field(default=30.0, gt=0, description="idle pooled engine connections are closed")
    max_upstream_connections: int = Field(default=0, ge=0, description="pool size over all engines; 0: unlimited")
    debug_headers: bool = Field(default=False, description="add x-fleetgate-endpoint and x-fleetgate-route-reasons")
    # Keys are required unless a deployment says otherwise: auth off is an explicit local-mode choice
    # (`fleetgate up` sets it), never what a forgotten setting falls back to.
    auth: Literal["open", "api_key"] = Field(
        default="api_key", description="api_key: tenants from the tenancy section; open: no keys (local mode only)"
    )
    default_max_tokens: int = Field(default=256, gt=0, description="estimate for rate limits when unset")
    exact_token_count: bool = Field(
        default=True, description="where the prompt bound would be refused, count with the engine's /tokenize"
    )
    token_count_timeout_s: float = Field(default=2.0, gt=0, description="longest wait for an exact token count")
    scale_from_zero: ScaleFromZeroSettings = Field(default_factory=ScaleFromZeroSettings)
    log_requests: bool = Field(default=True, description="one structured JSON log line per request")
    log_level: str = "info"


class PromptBoundSettings(_Strict):
    """What the model's chat template and processor add to a request's own text, for the reservation's prompt
    bound (`fleetgate.gateway.prompt_bound`; the defaults cover Llama 3.x, Qwen 2.5, Gemma 3 and Mistral
    templates with tools, and the largest default image sizes of vLLM's vision models)."""

    tokens_per_message: int = Field(default=16, ge=0, description="turn markers per chat message")
    tokens_per_request: int = Field(
        default=256, ge=0, description="BOS, generation prompt, default system text, tool-use instructions")
    tokens_per_image: int = Field(default=16384, ge=0, description="placeholder tokens of one image, at most")
    tokens_per_audio: int = Field(default=16384, ge=0, description="placeholder tokens of one audio clip, at most")
    tokens_per_video: int = Field(default=65536, ge=0, description="placeholder tokens of one video, at most")

    def profile(self) -> PromptProfile:
        return PromptProfile(tokens_per_message=self.tokens_per_message, tokens_per_request=self.tokens_per_request,
                             tokens_per_media={"image": self.tokens_per_image, "audio": self.tokens_per_audio,
                                               "video": self.tokens_per_video})


class AdapterRoute(_Strict):
    """A LoRA adapter served on its base model's endpoints: clients ask for it by `name`."""

    name: str = Field(min_length=1, description="the model name clients send; unique among models and adapters")
    source: str = Field(min_length=1, description="what the engine loads (vLLM's lora_path)")
    rank: int | None = Field(default=None, ge=1, description="LoRA rank r, when known")
    tenants: list[str] = Field(
        default_factory=list, description="tenants allowed to use it; empty: any tenant whose models allow it"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not valid_adapter_name(value):
            raise ValueError(
                f"adapter name {value!r} is not valid: lower-case letters, digits, '-', '.', '_', "
                f"starting and ending with a letter or digit, at most {ADAPTER_NAME_MAX} characters"
            )
        return value

    def spec(self, *, base: str) -> AdapterSpec:
        return AdapterSpec(
            name=self.name, base=base, source=self.source, rank=self.rank, tenants=frozenset(self.tenants)
        )


ZMQ_ADDRESS_PATTERN = r"^(tcp://[^\s/]+:[0-9]{1,5}|ipc:///[^\s]+)$"


class KvEventsRoute(_Strict):
    """Where one engine of a route publishes its KV-cache events (its `--kv-events-config`), for the
    `precise-prefix-scorer`."""

    endpoint: str = Field(min_length=1, description="the engine's base URL, as listed in the route's endpoints")
    publisher: str = Field(pattern=ZMQ_ADDRESS_PATTERN,
                           description="the engine's ZMQ PUB address: tcp://host:port or ipc:///path")
    replay: str | None = Field(default=None, pattern=ZMQ_ADDRESS_PATTERN,
                               description="its replay (ROUTER) address; without it, lost messages clear the set")
    topic: str = Field(default="", description="the topic it publishes on")


class ModelRoute(_Strict):
    """A model the gateway serves and the engines that serve it (static discovery)."""

    name: str = Field(min_length=1, description="the name clients ask for")
    endpoints: list[str] = Field(default_factory=list, description="engine base URLs, e.g. http://127.0.0.1:8100")
    served_name: str | None = Field(default=None, description="the engine's own model name, if it differs")
    max_model_len: int | None = Field(
        default=None, ge=1, description="context length: bounds the reservation when a request sets no max_tokens"
    )
    adapters: list[AdapterRoute] = Field(
        default_factory=list, description="LoRA adapters served on this model's endpoints (engines need --enable-lora)"
    )
    task: Literal["generate", "embed"] = Field(
        default="generate", description="embed: an encoder (vLLM --runner pooling); chat and completions refuse it"
    )
    prompt_bound: PromptBoundSettings = Field(
        default_factory=PromptBoundSettings, description="the template's text for the reservation's prompt bound"
    )
    kv_events: list[KvEventsRoute] = Field(
        default_factory=list, description="where endpoints publish KV-cache events (precise prefix routing)"
    )

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {url!r} must start with http:// or https://")
            url = url.rstrip("/")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            out.append(url)
        return out

    @model_validator(mode="after")
    def _kv_events_of_listed_endpoints(self) -> ModelRoute:
        listed = set(self.endpoints)
        seen: set[str] = set()
        for entry in self.kv_events:
            url = entry.endpoint.rstrip("/").removesuffix("/v1")
            if url not in listed:
                raise ValueError(f"kv_events names endpoint {entry.endpoint!r}, which is not in endpoints")
            if url in seen:
                raise ValueError(f"kv_events names endpoint {entry.endpoint!r} twice")
            seen.add(url)
        return self

    def kv_events_of(self, url: str) -> KvEventsRoute | None:
        """The event address of endpoint `url` (a normalised entry of `endpoints`), if one is configured."""
        for entry in self.kv_events:
            if entry.endpoint.rstrip("/").removesuffix("/v1") == url:
                return entry
        return None


class DiscoverySettings(_Strict):
    kind: Literal["static", "kubernetes", "inferencepool"] = Field(
        default="static", description="static: `models`; kubernetes: InferenceServices and their EndpointSlices; "
        "inferencepool: Gateway API Inference Extension InferencePools and the pods they select")
    namespace: str | None = Field(default=None, description="kubernetes, inferencepool: namespace to watch (None: "
                                  "the pod's own; kubernetes also takes every namespace then, if allowed)")
    label_selector: str = "app.kubernetes.io/managed-by=fleetgate"
    pool: str | None = Field(default=None, description="inferencepool: the one pool to serve (None: every pool)")
    pod_label_selector: str = Field(default="", description="inferencepool: watch only pods with these labels")
    resync_s: float = Field(default=30.0, gt=0)


class EppSettings(_Strict):
    """`fleetgate epp`: the same stages served as a Gateway API Inference Extension Endpoint Picker (ext_proc)."""

    host: str = Field(default="127.0.0.1", description="gRPC listen address (0.0.0.0 in a pod)")
    port: int = Field(default=9002, ge=0, le=65535, description="ext_proc and gRPC health (9002: the GIE default)")
    max_endpoints: int = Field(
        default=1, ge=1, le=2, description="endpoints per pick, the proxy's retry order (plain Envoy's ORIGINAL_DST "
        "cluster reads one; gateways that walk the list can use the scheduler's fallback too)")
    assemble_non_streaming: bool = Field(
        default=True, description="stream a non-streaming request from the engine and assemble the answer, as the "
        "gateway does, so a client that leaves is charged the tokens generated so far; off: one JSON answer from "
        "the engine (far fewer ext_proc messages per request; a client that leaves is charged the prompt estimate)")


class GatewaySettings(_Strict):
    server: ServerSettings = Field(default_factory=ServerSettings)
    models: list[ModelRoute] = Field(default_factory=list)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    redis_url: str | None = Field(default=None, description="shared state for several replicas; None: in memory")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    cache: CacheConfig = Field(default_factory=lambda: CacheConfig(enabled=False))  # no section: off
    tiers: TierConfig = Field(default_factory=TierConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    epp: EppSettings = Field(default_factory=EppSettings)

    @field_validator("models")
    @classmethod
    def _unique(cls, value: list[ModelRoute]) -> list[ModelRoute]:
        names = [m.name for m in value] + [a.name for m in value for a in m.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model and adapter names must be unique, repeated: {', '.join(dupes)}")
        return value
