"""The built wheel is the product: build it, install it into a fresh virtual environment and import
every subpackage from outside the repository, where no folder of ours can stand in for the wheel.

Third-party dependencies come from the project's venv through a `.pth` line (that adds the
directory to `sys.path` without running the venv's own `.pth` files, so the editable install of
fleetgate stays invisible): the test checks our packaging, not PyPI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["pyproject.toml", "setup.py", "README.md", "fleetgate", "operator", "gateway", "router", "cache",
           "engine_image"]
SUBPACKAGES = [
    "fleetgate",
    "fleetgate.core",
    "fleetgate.engine",
    "fleetgate.local",
    "fleetgate.sim",
    "fleetgate.bench",
    "fleetgate.operator",
    "fleetgate.gateway",
    "fleetgate.router",
    "fleetgate.router.tiers",
    "fleetgate.cache",
    "fleetgate.engine_image",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Build from a copy of the sources: an in-tree build would write build/ and *.egg-info into the
    # working tree that other processes use, and a copy proves that nothing outside SOURCES is needed.
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True, cwd=src, timeout=300,
    )
    (built,) = out.glob("fleetgate-*.whl")
    return built


def test_wheel_maps_every_folder_under_fleetgate(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert "operator" not in top, "a top-level `operator` package would shadow the standard library"
    assert {t for t in top if not t.endswith(".dist-info")} == {"fleetgate"}
    for package in SUBPACKAGES:
        assert package.replace(".", "/") + "/__init__.py" in names, package
    assert "fleetgate/py.typed" in names


def test_installed_wheel_imports_every_subpackage_outside_the_repo(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True, timeout=300,
    )
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip())
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import importlib, json, sys\n"
        f"mods = {SUBPACKAGES!r}\n"
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in mods}))\n"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    proc = subprocess.run(
        [str(python), "-c", code], cwd=outside, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONSAFEPATH": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    for module, file in files.items():
        assert Path(file).is_relative_to(site), f"{module} imported from {file}, not from the installed wheel"
    assert not any(Path(f).is_relative_to(REPO) for f in files.values())
    cli = subprocess.run([str(env_dir / "bin" / "fleetgate"), "--help"], cwd=outside, capture_output=True,
                         text=True, timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert cli.returncode == 0 and "prepare-model" in cli.stdout, cli.stderr
