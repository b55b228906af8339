"""API keys: generation, hashing and the `Authenticator` that maps a bearer key to a tenant.

Keys are 256-bit random strings (`fg-` + 43 url-safe characters). The gateway stores and compares only
`sha256:<hex>` of a key. A plain, fast hash is the right tool here: slow password hashes (scrypt,
argon2) exist to protect low-entropy human passwords from offline guessing, but guessing a 256-bit
random key is infeasible at any hash speed, and a slow hash would add tens of milliseconds and a CPU
burst to every request on the hot path. Lookup is a dict access by hash, so comparison timing reveals
nothing about a stored key.

An operator creates a key with::

    PYTHONSAFEPATH=1 python -c "from fleetgate.gateway.tenancy.keys import new_key; print(*new_key(), sep='\\n')"

hands the first line (the key) to the tenant and puts the second (the hash) into the config or Secret.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from fleetgate.core.errors import AuthenticationError, ConfigError, PermissionDeniedError
from fleetgate.gateway.authorization import shown
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.tenancy.config import HASH_PREFIX, TenancyConfig, load_keys_file, merged_with_keys_file

log = logging.getLogger(__name__)

KEY_PREFIX = "fg-"
ADMIN = Tenant(id="admin", name="administrator", allowed_models=frozenset(), is_admin=True)


def hash_key(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh random key and its hash: give the key to the tenant, store only the hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


def bearer_key(authorization: str | None) -> str:
    if not authorization:
        raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthenticationError("malformed Authorization header: expected `Bearer <key>`")
    return value.strip()


@dataclass(frozen=True, slots=True)
class KeyTable:
    by_hash: dict[str, Tenant]

    @classmethod
    def build(cls, config: TenancyConfig) -> KeyTable:
        table: dict[str, Tenant] = {h: ADMIN for h in config.admin_key_hashes}
        for t in config.tenants:
            tenant = Tenant(
                id=t.id,
                name=t.name or t.id,
                allowed_models=frozenset(t.models) if t.models is not None else None,
                is_admin=t.admin,
            )
            for h in t.key_hashes:
                table[h] = tenant
        return cls(by_hash=table)


class KeyAuthenticator:
    """`Authenticator` over hashed keys; re-reads `keys_file` when its mtime changes (rotated Secrets)."""

    def __init__(self, config: TenancyConfig) -> None:
        self._base = config
        self._keys_file = config.keys_file
        self._reload_s = config.keys_reload_s
        self._checked_at = 0.0
        self._mtime: float | None = None
        self._table = KeyTable.build(self._load())

    def _load(self) -> TenancyConfig:
        if self._keys_file is None:
            return self._base
        path = Path(self._keys_file)
        try:
            self._mtime = path.stat().st_mtime
        except FileNotFoundError as exc:
            raise ConfigError(f"tenancy.keys_file {path} does not exist (is the Secret mounted?)") from exc
        return merged_with_keys_file(self._base, load_keys_file(path), source=str(path))

    def _maybe_reload(self) -> None:
        if self._keys_file is None:
            return
        now = time.monotonic()
        if now - self._checked_at < self._reload_s:
            return
        self._checked_at = now
        try:
            mtime = Path(self._keys_file).stat().st_mtime
            if mtime != self._mtime:
                self._table = KeyTable.build(self._load())
                log.info("reloaded API keys", extra={"keys_file": str(self._keys_file)})
        except (OSError, ConfigError) as exc:
            # Keep serving with the keys we have: a half-written Secret update must not lock everyone out.
            log.warning("could not reload API keys; keeping the previous ones", extra={"error": str(exc)})

    def lookup(self, key: str) -> Tenant | None:
        self._maybe_reload()
        return self._table.by_hash.get(hash_key(key))

    async def authenticate(self, authorization: str | None) -> Tenant:
        tenant = self.lookup(bearer_key(authorization))
        if tenant is None:
            raise AuthenticationError("invalid API key")
        return tenant

    def authorize(self, tenant: Tenant, model: str) -> None:
        if tenant.is_admin and tenant.allowed_models is not None and not tenant.allowed_models:
            raise PermissionDeniedError("the admin key is for admin endpoints; use a tenant key for inference")
        if tenant.allowed_models is not None and model not in tenant.allowed_models:
            raise PermissionDeniedError(f"tenant {tenant.id!r} may not use model {shown(model)}", param="model")
