"""The routing configuration: plugins and scheduling profiles, versioned, with embedded defaults.

YAML shape (the Gateway API Inference Extension's EndpointPickerConfig, camelCase keys):

    apiVersion: fleetgate.io/v1alpha1
    kind: RoutingConfig
    plugins:                       # instances: a type from the registry, a name, parameters
      - {type: prefix-affinity-scorer, name: prefix, parameters: {blockChars: 512}}
    schedulingProfiles:            # the first profile (or the one named `default`) is used
      - name: default
        plugins: [{pluginRef: prefix, weight: 3}, ...]
    scrape: {intervalS: 0.5, timeoutS: 1.0, healthIntervalS: 2.0}
    ejection: {baseS: 1.0, maxS: 30.0}
    loadSync: {shared: auto, intervalS: 0.02, maxAgeS: 2.0}   # gateway replicas' in-flight counts

`RoutingConfig()` is the shipped default; `preset(name)` gives the benchmark's comparison policies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from pydantic.alias_generators import to_camel

API_VERSION: Literal["fleetgate.io/v1alpha1"] = "fleetgate.io/v1alpha1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class PluginSpec(_Model):
    type: str
    name: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        return self.name or self.type


class PluginRef(_Model):
    plugin_ref: str
    weight: float = Field(default=1.0, ge=0.0)


class SchedulingProfile(_Model):
    name: str
    plugins: list[PluginRef]


class ScrapeConfig(_Model):
    interval_s: float = Field(default=0.5, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    health_interval_s: float = Field(default=2.0, gt=0)


class EjectionConfig(_Model):
    base_s: float = Field(default=1.0, gt=0)
    max_s: float = Field(default=30.0, gt=0)


class LoadSyncConfig(_Model):
    """Gateway replicas' in-flight counts shared through the store (`fleetgate.router.load_sync`): `shared` auto
    (on when the store is networked, e.g. Redis), true or false; a sync every `intervalS`; a replica's counts
    ignored once `maxAgeS` old. Why 20 ms, not the 50 of the prefix index's and queued prefill's syncs: what a
    replica cannot see is the requests the others placed since their last sync, and the hotspot guards act on 2
    requests of excess; on the simulator with time scaled to the GPU runs' rates, the penalty of two replicas at
    0.7-0.95x round-robin's capacity stayed with every sync at the 50 ms scale and mostly went with the in-flight
    counts at the 10-16 ms scale (docs/reports/gateway-replicas.md, "In-flight counts shared between replicas")."""

    shared: Literal["auto"] | StrictBool = "auto"  # strict: YAML's "yes" or "off" is an error, not a bool
    interval_s: float = Field(default=0.02, gt=0)
    max_age_s: float = Field(default=2.0, gt=0)


def _default_plugins() -> list[PluginSpec]:
    return [
        PluginSpec(type="healthy-filter", name="healthy"),
        PluginSpec(type="prefix-affinity-scorer", name="prefix"),
        PluginSpec(type="inflight-scorer", name="inflight"),
        PluginSpec(type="prefill-queue-scorer", name="prefill", parameters={"warmShare": 0.5}),
        PluginSpec(type="queue-depth-scorer", name="queue"),
        PluginSpec(type="kv-cache-usage-scorer", name="kv-usage"),
        PluginSpec(type="session-affinity-scorer", name="session"),
        PluginSpec(type="adapter-affinity-scorer", name="adapter"),
        PluginSpec(type="max-score-picker", name="max-score"),
    ]


def _default_profiles() -> list[SchedulingProfile]:
    # adapter: stronger than prefix affinity (a LoRA load or GPU-slot swap costs more than a prefix miss; its
    # hotspot guard hands a hot adapter to the load scorers); neutral for base-model requests. 3 measured
    # best of 2 and 3 in `fleetgate bench cost --lora` (fewer loads and swaps, lower TTFT p90).
    # prefill: the prefill an engine must do before a cold prompt's first token (its queued prefill plus this
    # request's own); it abstains for a prompt an engine holds half of or more (warmShare), which prefix affinity
    # and its hotspot guard place as before. Weight chosen on the simulator (1-3), judged on 2 H100s in three runs
    # (docs/reports/gpu-routing.md, runs 4a-4c): unique prompts' TTFT p90 7.7-26% below least-loaded's in five
    # measurements (the old default: -13.6% to +20%); without warmShare it also won at 1.0x in all three runs but
    # lost 9-18 points of cache hits at 1.2x in two (a warm prompt moved for queued prefill duplicates its prefix).
    refs = [("healthy", 1.0), ("prefix", 2.0), ("inflight", 1.0), ("prefill", 3.0), ("queue", 1.0),
            ("kv-usage", 0.5), ("session", 1.0), ("adapter", 3.0), ("max-score", 1.0)]
    return [SchedulingProfile(name="default", plugins=[PluginRef(plugin_ref=r, weight=w) for r, w in refs])]


class RoutingConfig(_Model):
    api_version: Literal["fleetgate.io/v1alpha1"] = API_VERSION
    kind: Literal["RoutingConfig"] = "RoutingConfig"
    plugins: list[PluginSpec] = Field(default_factory=_default_plugins)
    scheduling_profiles: list[SchedulingProfile] = Field(default_factory=_default_profiles, min_length=1)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    ejection: EjectionConfig = Field(default_factory=EjectionConfig)
    load_sync: LoadSyncConfig = Field(default_factory=LoadSyncConfig)

    @model_validator(mode="after")
    def _check_refs(self) -> RoutingConfig:
        names = [p.ref for p in self.plugins]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate plugin names: {', '.join(dupes)}")
        for profile in self.scheduling_profiles:
            for ref in profile.plugins:
                if ref.plugin_ref not in names:
                    raise ValueError(
                        f"profile {profile.name!r} refers to plugin {ref.plugin_ref!r}, which is not declared"
                    )
        return self

    def profile(self) -> SchedulingProfile:
        for p in self.scheduling_profiles:
            if p.name == "default":
                return p
        return self.scheduling_profiles[0]


def precise_prefix_config(parameters: dict[str, Any] | None = None) -> RoutingConfig:
    """The shipped default with its prefix scorer made precise: `precise-prefix-scorer` (the engines' own KV
    events, the approximate index as its per-endpoint fallback) under the same name and weight, so load,
    session and adapter scorers stay as they are, plus the approximate index as a scorer of its own (`history`,
    weight 1, before `prefix` so that the precise scorer's cached shares are the ones the queued-prefill scorer
    reads). The profile is named `precise-prefix`.

    Why `history`: past saturation the engines evict shared system prompts, the precise scorer then sees every
    engine cold for a prompt group, load alone places the next request and the group splits across engines,
    each recomputing and holding a copy; the approximate index remembers where the group went and keeps it
    there. Hypothesis from runs 7b/7e, then judged on fresh seeds on 2 H200s (docs/reports/gpu-routing.md,
    runs 8a, 8b, 8d): against the default, TTFT p90 lower in 10 samples of 10 at 1.0-1.5x, output tokens/s
    higher in 9, uncached prefill lower in 10; without it the precise profile had lost to the default in 7 of
    10 samples at 1.5x."""
    base = RoutingConfig()
    plugins: list[PluginSpec] = []
    for p in base.plugins:
        if p.ref == "prefix":
            plugins.append(PluginSpec(type="prefix-affinity-scorer", name="history"))
            plugins.append(PluginSpec(type="precise-prefix-scorer", name="prefix", parameters=dict(parameters or {})))
        else:
            plugins.append(p)
    refs: list[PluginRef] = []
    for ref in base.scheduling_profiles[0].plugins:
        if ref.plugin_ref == "prefix":
            refs.append(PluginRef(plugin_ref="history", weight=1.0))
        refs.append(ref)
    return RoutingConfig(plugins=plugins, scheduling_profiles=[SchedulingProfile(name="precise-prefix", plugins=refs)])


# Parameters the `default-sticky` preset adds to the shipped default's plugins (scripts/gpu/profiles/default-sticky.yaml
# is the same profile as a file, for GPU runs of builds without the preset).
STICKY_PARAMETERS: dict[str, dict[str, float]] = {
    "prefix": {"hotspotRelativeMargin": 0.5},
    "inflight": {"relativeSpan": 0.5},
    "prefill": {"hotspotRelativeMargin": 0.5},
    "queue": {"relativeSpan": 0.5},
}


def default_sticky_config() -> RoutingConfig:
    """The shipped default with its load signals relative to the load itself, named `default-sticky` (opt-in):
    the hotspot guards of prefix affinity and queued prefill fade a preference out past max(2, 0.5 x the least
    candidate load) requests of excess, not 2, and the inflight and queue-depth scorers' min-max span is at least
    half the larger load, so 61 against 60 requests in flight is a 0.03 vote, not a whole one.

    Why: past saturation (issue 24, 2 H200s at 1.35x) every engine carries 60-100 requests, a lead of a few
    requests is always somewhere, and the default's guard and whole votes move a prompt group to the other engine,
    which then recomputes and holds its prefix too: the hit rate falls to 37-41% and with it the capacity. On the
    simulator (vllm-v1 engine model, H200 constants, held-out seeds), against the default at 1.2-1.5x: hit rate
    79-88% against 47-51%, output tokens/s 1.15-1.35x, TTFT p90 0.09-0.14x; unique prompts and one hot system prompt
    no worse (docs/reports/routing-saturation.md). Not judged on GPUs yet, hence not the default."""
    base = RoutingConfig()
    plugins = [p.model_copy(update={"parameters": {**p.parameters, **STICKY_PARAMETERS.get(p.ref, {})}})
               for p in base.plugins]
    profile = base.scheduling_profiles[0].model_copy(update={"name": "default-sticky"})
    return RoutingConfig(plugins=plugins, scheduling_profiles=[profile])


def _policy(name: str, plugins: list[PluginSpec], weights: dict[str, float]) -> RoutingConfig:
    refs = [PluginRef(plugin_ref=p.ref, weight=weights.get(p.ref, 1.0)) for p in plugins]
    return RoutingConfig(plugins=plugins, scheduling_profiles=[SchedulingProfile(name=name, plugins=refs)])


def preset(name: str) -> RoutingConfig:
    """Named policies: `default` (shipped), `least-loaded` (adapter-blind), `adapter-affinity` (least-loaded
    plus the adapter-affinity scorer: what LoRA affinity adds to load balancing), `prefix-only`, `random`,
    `precise-prefix` (the default with prefix affinity from the engines' KV events and the approximate index beside
    it, `precise_prefix_config`), `default-sticky` (the default with load signals relative to the load,
    `default_sticky_config`)."""
    base = [PluginSpec(type="healthy-filter", name="healthy")]
    if name == "default":
        return RoutingConfig()
    if name == "least-loaded":
        return _policy(name, [*base, PluginSpec(type="inflight-scorer", name="inflight"),
                              PluginSpec(type="max-score-picker", name="max-score")], {})
    if name == "adapter-affinity":
        plugins = [*base, PluginSpec(type="inflight-scorer", name="inflight"),
                   PluginSpec(type="adapter-affinity-scorer", name="adapter"),
                   PluginSpec(type="max-score-picker", name="max-score")]
        return _policy(name, plugins, {"adapter": 3.0})
    if name == "prefix-only":
        prefix = PluginSpec(type="prefix-affinity-scorer", name="prefix", parameters={"hotspotMargin": None})
        return _policy(name, [*base, prefix, PluginSpec(type="max-score-picker", name="max-score")], {})
    if name == "random":
        return _policy(name, [*base, PluginSpec(type="weighted-random-picker", name="random")], {})
    if name == "precise-prefix":
        return precise_prefix_config()
    if name == "default-sticky":
        return default_sticky_config()
    known = "default, least-loaded, adapter-affinity, prefix-only, random, precise-prefix, default-sticky"
    raise ValueError(f"unknown routing preset {name!r}; known: {known}")
