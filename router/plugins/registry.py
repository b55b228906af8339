"""Plugin types by name: the registry `build_scheduler` resolves a config's `type:` fields in.

Each entry maps a type name to `module:factory`; the module is imported only when the type is used.
A factory is `factory(*, name, parameters, ctx) -> plugin`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from fleetgate.core.errors import ConfigError
from fleetgate.router.plugins.base import PluginContext

PLUGIN_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "healthy-filter": "fleetgate.router.plugins.healthy_filter:build",
        "saturation-filter": "fleetgate.router.plugins.saturation_filter:build",
        "serves-model-filter": "fleetgate.router.plugins.model_filter:build",
        "prefix-affinity-scorer": "fleetgate.router.plugins.prefix_scorer:build",
        "precise-prefix-scorer": "fleetgate.router.plugins.precise_prefix_scorer:build",
        "queue-depth-scorer": "fleetgate.router.plugins.queue_scorer:build",
        "kv-cache-usage-scorer": "fleetgate.router.plugins.kv_usage_scorer:build",
        "inflight-scorer": "fleetgate.router.plugins.inflight_scorer:build",
        "prefill-queue-scorer": "fleetgate.router.plugins.prefill_queue_scorer:build",
        "session-affinity-scorer": "fleetgate.router.plugins.session_scorer:build",
        "adapter-affinity-scorer": "fleetgate.router.plugins.adapter_scorer:build",
        "max-score-picker": "fleetgate.router.plugins.max_score_picker:build",
        "weighted-random-picker": "fleetgate.router.plugins.random_picker:build",
    }
)

PluginFactory = Callable[..., Any]


def resolve(type_name: str, *, extra: Mapping[str, PluginFactory] | None = None) -> PluginFactory:
    if extra and type_name in extra:
        return extra[type_name]
    target = PLUGIN_TYPES.get(type_name)
    if target is None:
        known = sorted([*PLUGIN_TYPES, *(extra or {})])
        raise ConfigError(f"unknown routing plugin type {type_name!r}; known types: {', '.join(known)}")
    module_name, attr = target.split(":")
    factory: PluginFactory = getattr(importlib.import_module(module_name), attr)
    return factory


def instantiate(
    type_name: str, *, name: str, parameters: dict[str, Any], ctx: PluginContext,
    extra: Mapping[str, PluginFactory] | None = None,
) -> Any:
    factory = resolve(type_name, extra=extra)
    try:
        return factory(name=name, parameters=dict(parameters), ctx=ctx)
    except ValueError as exc:
        raise ConfigError(f"routing plugin {name!r} ({type_name}): {exc}") from exc
