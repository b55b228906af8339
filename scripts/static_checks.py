"""Run import-linter and mypy on the package tree as it is installed.

Both tools find modules by walking folders, so they cannot follow setuptools' `package_dir`
mapping (`operator/` -> `fleetgate.operator`). This script copies the mapped folders into
`build/tree/fleetgate/...` (the wheel's layout) and runs the tools there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "tree"
MAPPING = {
    "fleetgate": "fleetgate",
    "fleetgate/operator": "operator",
    "fleetgate/gateway": "gateway",
    "fleetgate/router": "router",
    "fleetgate/cache": "cache",
    "fleetgate/engine_image": "engine_image",
}


def assemble() -> Path:
    shutil.rmtree(TREE, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for target, source in MAPPING.items():
        shutil.copytree(ROOT / source, TREE / target, ignore=ignore, dirs_exist_ok=True)
    return TREE


def main() -> int:
    tree = assemble()
    env_path = str(tree)
    rc = subprocess.call(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from importlinter.cli import lint_imports_command; sys.argv=['lint-imports', '--config', sys.argv[2]]; "
         "lint_imports_command()", env_path, str(ROOT / ".importlinter")],
        cwd=tree,
    )
    if rc != 0:
        print("import-linter: contracts broken", file=sys.stderr)
        return rc
    rc = subprocess.call(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "fleetgate"],
        cwd=tree,
        env={**__import__("os").environ, "MYPYPATH": env_path},
    )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
