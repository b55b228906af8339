"""The `encoder:` section of `fleetgate up`'s file, apart from the engine that runs it
(`fleetgate.local.encoder_engine`), so that the file's model imports no engine code."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

ENCODER_MODEL = "all-minilm-l6-v2"


class EncoderEngineConfig(BaseModel):
    """The `encoder:` section of `fleetgate up`'s file (`--embedder engine` turns it on)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="run the cache's encoder as a vLLM CPU pooling engine")
    model: str = Field(default=ENCODER_MODEL, min_length=1, description="its served model name")
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port")
    threads: int = Field(default=1, ge=1, description="OpenMP threads of the engine")
    # On a busy 2-core box a CPU encoder answers a lookup in tens of ms; the GPU fleet's default is 100.
    timeout_ms: float = Field(default=2000.0, gt=0, description="the cache's bound on one lookup's wait")
    startup_timeout_s: float = Field(default=600.0, gt=0)
    log_dir: Path = Field(default=Path(".fleetgate/logs"), description="encoder.log goes here")
