"""Loading YAML configuration into typed pydantic models with errors that name the file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fleetgate.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {p} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def parse_model(model: type[M], data: dict[str, Any], *, source: str = "<config>") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"invalid configuration in {source}:"]
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from exc


def load_model(model: type[M], path: str | Path | None) -> M:
    """Load `path` into `model`; with no path, the model's embedded defaults."""
    if path is None:
        return model()
    return parse_model(model, load_yaml(path), source=str(path))
