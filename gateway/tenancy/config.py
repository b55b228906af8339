"""Tenancy configuration: tenants, hashed API keys, limits, budgets and prices.

One pydantic model, `TenancyConfig`, is the `tenancy:` section of the gateway's settings. Keys are never
stored in clear: tenants list `sha256:<hex>` hashes (see `keys.hash_key`). In a cluster the hashes come
from a file mounted from a Kubernetes Secret (`keys_file`); locally they can sit in the config file. Both
go through the same loader (`load_keys_file` + `merged_with_keys_file`).

Whether keys are required is the gateway's `server.auth` setting (`api_key`, or `open` for local mode
only); this section says who the tenants are and what they may spend.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from fleetgate.core.config import load_yaml, parse_model
from fleetgate.core.errors import ConfigError

HASH_PREFIX = "sha256:"


def _check_hash(value: str) -> str:
    hexpart = value.removeprefix(HASH_PREFIX)
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(
            "an API key entry must be `sha256:<64 lowercase hex>` (the hash, never the key itself); "
            "create one with fleetgate.gateway.tenancy.keys.new_key()"
        )
    return HASH_PREFIX + hexpart


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListPrice(_Strict):
    """Provider-style list price in dollars per 1M tokens."""

    kind: Literal["list"] = "list"
    input_usd_per_1m: Decimal = Field(ge=0)
    output_usd_per_1m: Decimal = Field(ge=0)
    cached_usd_per_1m: Decimal | None = Field(default=None, ge=0)  # None: same as input


class GpuPrice(_Strict):
    """Infrastructure-derived price: the GPUs' hourly cost divided by the tokens they serve per hour.

    `fallback_tokens_per_hour` is used until `min_tokens` were measured in the window (an idle GPU would
    otherwise make the first tokens infinitely expensive). The weights say what one token of each kind
    counts for against GPU time (an output token takes a decode step; a prefix-cached one is nearly free).
    """

    kind: Literal["gpu"]
    gpu_type: str
    gpu_count: int = Field(ge=1)
    usd_per_gpu_hour: Decimal = Field(gt=0)
    window_s: float = Field(default=3600.0, gt=0)
    min_tokens: int = Field(default=10_000, ge=1)
    fallback_tokens_per_hour: int = Field(gt=0)
    input_weight: Decimal = Field(default=Decimal(1), ge=0)
    output_weight: Decimal = Field(default=Decimal(1), ge=0)
    cached_weight: Decimal = Field(default=Decimal(1), ge=0)
    refresh_s: float = Field(default=30.0, gt=0)


def _price_kind(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "list"))
    return str(getattr(value, "kind", "list"))


# `kind` may be left out for list prices, the common case.
Price = Annotated[
    Annotated[ListPrice, Tag("list")] | Annotated[GpuPrice, Tag("gpu")], Discriminator(_price_kind)
]


class ModelBudget(_Strict):
    """A tenant's spend cap on one model name (a LoRA adapter, typically), inside its overall budgets."""

    daily_budget_usd: Decimal | None = Field(default=None, ge=0)
    monthly_budget_usd: Decimal | None = Field(default=None, ge=0)


class TenantConfig(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    name: str = ""
    key_hashes: list[str] = Field(default_factory=list)
    models: list[str] | None = None  # None: every model
    admin: bool = False  # may read every tenant's usage
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    daily_budget_usd: Decimal | None = Field(default=None, ge=0)
    monthly_budget_usd: Decimal | None = Field(default=None, ge=0)
    # Per requested model name (an adapter, a model; not a tier alias, which names no one model).
    model_budgets: dict[str, ModelBudget] = Field(default_factory=dict)

    @field_validator("key_hashes")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        return [_check_hash(v) for v in value]


class TenancyConfig(_Strict):
    admin_key_hashes: list[str] = Field(default_factory=list)
    tenants: list[TenantConfig] = Field(default_factory=list)
    keys_file: Path | None = None  # YAML mounted from a Secret: {admin_key_hashes: [...], tenants: {id: [...]}}
    keys_reload_s: float = Field(default=10.0, gt=0)
    prices: dict[str, Price] = Field(default_factory=dict)
    default_price: ListPrice | None = None  # models without an entry; None: they cost nothing
    savings_baseline_model: str | None = None  # tiering savings: what this model would have cost
    on_store_error: Literal["open", "closed"] = "open"
    redis_timeout_s: float = Field(default=2.0, gt=0)  # connect, command and pool wait; then on_store_error
    redis_max_connections: int = Field(default=64, ge=1)  # per gateway replica; a burst queues for these
    store_retry_s: float = Field(default=0.25, ge=0)  # after a store failure, one request probes it this often
    default_max_tokens: int = Field(default=1024, ge=1)  # reservation estimate when a request sets none
    sliding_minute_windows: bool = True
    usage_retention_days: int = Field(default=400, ge=1)
    redis_prefix: str = "fg:tenancy:"

    @field_validator("admin_key_hashes")
    @classmethod
    def _admin_hashes(cls, value: list[str]) -> list[str]:
        return [_check_hash(v) for v in value]

    @model_validator(mode="after")
    def _unique(self) -> TenancyConfig:
        seen: dict[str, str] = {}
        ids = [t.id for t in self.tenants]
        if len(ids) != len(set(ids)):
            raise ValueError("tenant ids must be unique")
        for tenant in self.tenants:
            for h in tenant.key_hashes:
                if h in seen or h in self.admin_key_hashes:
                    raise ValueError(f"key hash {h[:15]}... is listed twice (tenant {tenant.id!r})")
                seen[h] = tenant.id
        return self

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        for t in self.tenants:
            if t.id == tenant_id:
                return t
        return None


class KeysFile(_Strict):
    """The Secret's content: hashes only, grouped by tenant id."""

    admin_key_hashes: list[str] = Field(default_factory=list)
    tenants: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("admin_key_hashes")
    @classmethod
    def _admin(cls, value: list[str]) -> list[str]:
        return [_check_hash(v) for v in value]

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return {tid: [_check_hash(h) for h in hashes] for tid, hashes in value.items()}


def load_keys_file(path: Path) -> KeysFile:
    return parse_model(KeysFile, load_yaml(path), source=str(path))


def merged_with_keys_file(config: TenancyConfig, keys: KeysFile, *, source: str = "<keys file>") -> TenancyConfig:
    """Add the file's hashes to the configured tenants (a hash for an unknown tenant is an error)."""
    unknown = sorted(set(keys.tenants) - {t.id for t in config.tenants})
    if unknown:
        raise ConfigError(f"{source}: keys for tenants that are not configured: {', '.join(unknown)}")
    tenants = [
        t.model_copy(update={"key_hashes": [*t.key_hashes, *keys.tenants.get(t.id, [])]}) for t in config.tenants
    ]
    data = config.model_dump()
    data["tenants"] = [t.model_dump() for t in tenants]
    data["admin_key_hashes"] = [*config.admin_key_hashes, *keys.admin_key_hashes]
    return parse_model(TenancyConfig, data, source=source)
