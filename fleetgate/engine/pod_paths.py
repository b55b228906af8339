"""Where an engine pod finds what a source names: shared by the operator (which mounts it) and the gateway's
Kubernetes discovery (which asks pods to load adapters by it), so both agree without importing each other.

- `hf://org/name`     -> `org/name`: a Hugging Face repository id, downloaded by vLLM into `HF_HOME`;
- `pvc://claim/path`  -> `/models/claim/path`: the operator mounts each claim read-only at `/models/claim`;
- `/absolute/path`    -> itself: baked into the engine image;
- `s3://...`          -> no pod path: vLLM streams models from S3 (`--load-format runai_streamer`), but its LoRA
                         loader reads only local paths and Hugging Face repositories.
"""

from __future__ import annotations

MODELS_MOUNT = "/models"


def pvc_claim(*, source: str) -> str | None:
    """The claim a `pvc://` source mounts, else None."""
    if not source.startswith("pvc://"):
        return None
    return source.removeprefix("pvc://").partition("/")[0]


def adapter_load_path(*, source: str) -> str | None:
    """The `lora_path` vLLM's runtime adapter API loads for an adapter source, or None if it cannot load it."""
    if source.startswith("hf://"):
        return source.removeprefix("hf://")
    if source.startswith("pvc://"):
        claim, _, path = source.removeprefix("pvc://").partition("/")
        return f"{MODELS_MOUNT}/{claim}/{path}".rstrip("/")
    if source.startswith("/"):
        return source
    return None
