"""vLLM's runtime LoRA API, as one small client that the operator, the gateway and the local stack share.

vLLM started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` serves:
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: 200 when loaded; 400 when a LoRA of that
  name is loaded already (taken here as success: the state asked for holds);
- `POST /v1/unload_lora_adapter {"lora_name"}`: 200 when unloaded; 404 (or 400 in older builds) when
  it was not loaded (success too, for the same reason);
- `GET /v1/models`: the base model and each loaded LoRA, the LoRA with `parent` = the base model's name
  and `root` = its path.
The simulator (`fleetgate.sim`) serves the same three routes. Every call has a deadline; failures raise
`AdapterApiError` with the engine's status and a short, sanitised reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetgate.core.adapters import LoadedAdapter

if TYPE_CHECKING:
    import aiohttp

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
_REASON_MAX = 300


class AdapterApiError(Exception):
    """An engine refused or failed an adapter call (`status` 0: no HTTP answer)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    import aiohttp

    return aiohttp.ClientTimeout(total=seconds)


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], *, timeout_s: float) -> tuple[int, str]:
    import aiohttp

    try:
        async with session.post(url, json=body, timeout=_timeout(timeout_s)) as resp:
            return resp.status, (await resp.text())[:_REASON_MAX]
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise AdapterApiError(f"{type(exc).__name__} calling {url}") from exc


def _already(text: str) -> bool:
    return "already" in text.lower()


async def load_adapter(
    session: aiohttp.ClientSession, base_url: str, *, name: str, source: str, timeout_s: float = 30.0
) -> None:
    """Load adapter `name` from `source` on the engine at `base_url` (idempotent)."""
    status, text = await _post(
        session, base_url + LOAD_PATH, {"lora_name": name, "lora_path": source}, timeout_s=timeout_s
    )
    if status == 200 or (status == 400 and _already(text)):
        return
    raise AdapterApiError(f"loading adapter {name!r} failed: HTTP {status}: {text}", status=status)


async def unload_adapter(session: aiohttp.ClientSession, base_url: str, *, name: str, timeout_s: float = 30.0) -> None:
    """Unload adapter `name` from the engine at `base_url` (idempotent: not loaded counts as done)."""
    status, text = await _post(session, base_url + UNLOAD_PATH, {"lora_name": name}, timeout_s=timeout_s)
    if status == 200 or status == 404 or (status == 400 and "not" in text.lower()):
        return
    raise AdapterApiError(f"unloading adapter {name!r} failed: HTTP {status}: {text}", status=status)


def parse_loaded(models_body: Any) -> list[LoadedAdapter]:
    """The LoRA adapters in a `/v1/models` body: entries whose `parent` names another model. Malformed
    bodies and entries yield nothing (an engine's answer is never trusted to be well formed)."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    out: list[LoadedAdapter] = []
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict):
            continue
        name, parent, root = entry.get("id"), entry.get("parent"), entry.get("root")
        if isinstance(name, str) and isinstance(parent, str) and parent and parent != name:
            out.append(LoadedAdapter(name=name, base=parent, source=root if isinstance(root, str) else None))
    return out


def is_models_body(models_body: Any) -> bool:
    """Whether a `/v1/models` body has the OpenAI list shape (`{"data": [...]}`), so that an empty adapter
    list read from it means "none loaded" rather than "could not tell"."""
    return isinstance(models_body, dict) and isinstance(models_body.get("data"), list)


async def loaded_adapters(
    session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 5.0, strict: bool = False
) -> list[LoadedAdapter]:
    """The adapters the engine at `base_url` has loaded now. With `strict`, a body that is not a model list
    raises `AdapterApiError` instead of reading as "none loaded" (a caller keeping state must not clear it
    on garbage)."""
    import aiohttp

    try:
        async with session.get(base_url + MODELS_PATH, timeout=_timeout(timeout_s)) as resp:
            if resp.status != 200:
                raise AdapterApiError(f"GET {MODELS_PATH}: HTTP {resp.status}", status=resp.status)
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise AdapterApiError(f"{type(exc).__name__} reading {base_url}{MODELS_PATH}") from exc
    if strict and not is_models_body(body):
        raise AdapterApiError(f"GET {MODELS_PATH}: not a model list", status=200)
    return parse_loaded(body)
