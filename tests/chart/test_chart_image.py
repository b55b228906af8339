"""The control-plane image (docker/fleetgate.Dockerfile) agrees with the chart and the package.

No Docker engine is available to the tests, so the image is never built here; these checks read the
Dockerfile: every COPY source exists, the extras it installs exist in pyproject.toml and cover what the
chart runs (Kopf and lightkube for the operator, lightkube for the gateway's discovery), and it runs as
the user the chart's pod security context names.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "fleetgate.Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_copy_sources_exist() -> None:
    copies = [rest for keyword, rest in _instructions() if keyword == "COPY" and "--from" not in rest]
    assert copies
    for rest in copies:
        *sources, _dest = rest.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_installed_extras_cover_what_the_chart_runs() -> None:
    (default,) = [rest.split("=", 1)[1] for keyword, rest in _instructions()
                  if keyword == "ARG" and rest.startswith("EXTRAS=")]
    extras = set(default.split(","))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    assert extras <= set(optional), f"unknown extras: {extras - set(optional)}"
    installed = " ".join(project["dependencies"] + [d for e in extras for d in optional[e]])
    for needed in ("kopf", "lightkube", "uvicorn", "redis"):
        assert needed in installed, f"the image would lack {needed}"


def test_runs_as_the_chart_user() -> None:
    users = [rest for keyword, rest in _instructions() if keyword == "USER"]
    values = yaml.safe_load((REPO / "charts" / "fleetgate" / "values.yaml").read_text())
    uid, gid = (int(part) for part in users[-1].split(":"))
    assert uid == values["podSecurityContext"]["runAsUser"] and gid == values["podSecurityContext"]["runAsGroup"]
    env = " ".join(rest for keyword, rest in _instructions() if keyword == "ENV")
    assert "PYTHONSAFEPATH=1" in env  # the package has a subpackage folder named `operator`
