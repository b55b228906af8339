"""Package discovery for the multi-root layout.

The top-level folders (`operator/`, `gateway/`, ...) are subpackages of the one import root
`fleetgate`. A folder named `operator` can never be a top-level package (the standard library
owns the name), so setuptools maps each folder into `fleetgate.*` through `package_dir`.
Nested packages are discovered here so that a new subpackage never needs a pyproject edit.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
ROOTS: dict[str, str] = {
    "fleetgate": "fleetgate",
    "fleetgate.operator": "operator",
    "fleetgate.gateway": "gateway",
    "fleetgate.router": "router",
    "fleetgate.cache": "cache",
    "fleetgate.engine_image": "engine_image",
}


def discover() -> list[str]:
    packages: list[str] = []
    for name, folder in ROOTS.items():
        root = HERE / folder
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            packages.append(".".join([name, *rel.parts]) if rel.parts else name)
    return packages


setup(
    packages=discover(),
    package_dir=ROOTS,
    package_data={"": ["*.html", "*.js", "*.css", "*.json", "*.yaml", "*.yml", "*.jinja", "*.txt", "data/*.safetensors",
                       "py.typed"]},
    include_package_data=True,
)
