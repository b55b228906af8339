"""API keys: hashing, 401 for missing/wrong keys, 403 for models a tenant may not use, Secret-file keys."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest
import yaml

from fleetgate.core.errors import AuthenticationError, ConfigError, PermissionDeniedError
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.keys import KeyAuthenticator, hash_key, new_key


def _config(**extra: object) -> tuple[TenancyConfig, dict[str, str]]:
    keys = {name: new_key() for name in ("acme", "globex", "admin")}
    data = {
        "admin_key_hashes": [keys["admin"][1]],
        "tenants": [
            {"id": "acme", "key_hashes": [keys["acme"][1]], "models": ["small"]},
            {"id": "globex", "key_hashes": [keys["globex"][1]]},
        ],
        **extra,
    }
    return TenancyConfig.model_validate(data), {k: v[0] for k, v in keys.items()}


def test_hash_is_sha256_of_the_key() -> None:
    assert hash_key("fg-abc") == "sha256:" + hashlib.sha256(b"fg-abc").hexdigest()


def test_new_keys_are_random_and_match_their_hash() -> None:
    (k1, h1), (k2, h2) = new_key(), new_key()
    assert k1 != k2 and k1.startswith("fg-") and len(k1) >= 40
    assert hash_key(k1) == h1 and hash_key(k2) == h2


async def test_valid_key_maps_to_its_tenant() -> None:
    config, keys = _config()
    auth = KeyAuthenticator(config)
    tenant = await auth.authenticate(f"Bearer {keys['acme']}")
    assert tenant.id == "acme" and tenant.allowed_models == frozenset({"small"})
    assert (await auth.authenticate(f"bearer {keys['globex']}")).id == "globex"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer fg-not-a-real-key"])
async def test_missing_malformed_or_wrong_key_is_401(header: str | None) -> None:
    config, _ = _config()
    with pytest.raises(AuthenticationError) as err:
        await KeyAuthenticator(config).authenticate(header)
    assert err.value.status == 401
    body = err.value.to_openai()["error"]
    assert body["type"] == "authentication_error" and body["code"] == "invalid_api_key"


async def test_model_outside_allow_list_is_403_and_others_pass() -> None:
    config, keys = _config()
    auth = KeyAuthenticator(config)
    acme = await auth.authenticate(f"Bearer {keys['acme']}")
    auth.authorize(acme, "small")
    with pytest.raises(PermissionDeniedError) as err:
        auth.authorize(acme, "large")
    assert err.value.status == 403 and "large" in err.value.message
    globex = await auth.authenticate(f"Bearer {keys['globex']}")
    auth.authorize(globex, "large")  # no allow-list: every model


async def test_admin_key_is_admin_but_not_for_inference() -> None:
    config, keys = _config()
    auth = KeyAuthenticator(config)
    admin = await auth.authenticate(f"Bearer {keys['admin']}")
    assert admin.is_admin
    with pytest.raises(PermissionDeniedError):
        auth.authorize(admin, "small")


def test_config_refuses_clear_text_keys_and_duplicates() -> None:
    with pytest.raises(ValueError, match="sha256"):
        TenancyConfig.model_validate({"tenants": [{"id": "a", "key_hashes": ["fg-clear-text-key"]}]})
    _, h = new_key()
    with pytest.raises(ValueError, match="twice"):
        TenancyConfig.model_validate({"tenants": [{"id": "a", "key_hashes": [h]}, {"id": "b", "key_hashes": [h]}]})


async def test_keys_file_from_a_secret_is_merged_and_reloaded(tmp_path: Path) -> None:
    k1, h1 = new_key()
    k2, h2 = new_key()
    secret = tmp_path / "keys.yaml"
    secret.write_text(yaml.safe_dump({"tenants": {"acme": [h1]}}))
    config = TenancyConfig.model_validate(
        {"tenants": [{"id": "acme"}], "keys_file": str(secret), "keys_reload_s": 0.001}
    )
    auth = KeyAuthenticator(config)
    assert (await auth.authenticate(f"Bearer {k1}")).id == "acme"
    with pytest.raises(AuthenticationError):
        await auth.authenticate(f"Bearer {k2}")
    # Rotate: the Secret now holds only the new key.
    secret.write_text(yaml.safe_dump({"tenants": {"acme": [h2]}}))
    future = time.time() + 5
    os.utime(secret, (future, future))
    await asyncio.sleep(0.01)
    assert (await auth.authenticate(f"Bearer {k2}")).id == "acme"
    with pytest.raises(AuthenticationError):
        await auth.authenticate(f"Bearer {k1}")


def test_keys_file_for_an_unknown_tenant_or_missing_file_is_a_config_error(tmp_path: Path) -> None:
    _, h = new_key()
    secret = tmp_path / "keys.yaml"
    secret.write_text(yaml.safe_dump({"tenants": {"nobody": [h]}}))
    with pytest.raises(ConfigError, match="nobody"):
        KeyAuthenticator(TenancyConfig.model_validate({"keys_file": str(secret)}))
    with pytest.raises(ConfigError, match="does not exist"):
        KeyAuthenticator(TenancyConfig.model_validate({"keys_file": str(tmp_path / "missing.yaml")}))
