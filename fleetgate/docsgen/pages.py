"""The generated reference pages: which file each generator writes, and whether the committed copies are current.

`python -m fleetgate.docsgen` writes every page; `--check` only compares and exits 1 listing the stale ones.
The documentation build renders them from the code too (`mkdocs_hooks.py`), so the site never shows a stale
copy; the committed copies are for reading in a repository browser and are kept current by the test suite.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from fleetgate.docsgen.markdown import BANNER

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def _gateway(banner: str) -> str:
    from fleetgate.docsgen import config_ref, plugins_ref
    from fleetgate.gateway.settings import GatewaySettings

    intro = ("The gateway's YAML file (`fleetgate gateway --config gateway.yaml`; in the chart, "
             "`gateway.config`), key by key with its default. A file may leave out any key that has a default; "
             "unknown keys are refused with the key's path. What the sections do: [the gateway guide]"
             "(../guides/gateway.md), [tenants and budgets](../guides/tenants.md), [the cache](../guides/cache.md), "
             "[tiers](../guides/tiers.md), [routing](../guides/routing.md).")
    page = config_ref.render(GatewaySettings, title="Gateway configuration", intro=intro,
                             source="`gateway/settings.py` and the section models it imports", banner=banner)
    return page + "\n## Routing plugin types\n\nThe `type` values `routing.plugins[]` accepts, from the plugin " \
        "registry, with the parameters each reads from `parameters` (camelCase) and its default.\n\n" + \
        plugins_ref.render_plugins() + "\n"


def _up(banner: str) -> str:
    from fleetgate.docsgen import config_ref
    from fleetgate.local.config import UpConfig

    intro = ("`fleetgate up --config up.yaml`: the local stack's file. `engine` configures the vLLM CPU (or "
             "simulated) engines; `gateway` is the whole [gateway configuration](gateway-config.md), in local "
             "mode (`server.auth: open`) unless the file says otherwise. Guide: [the local stack]"
             "(../guides/local-stack.md).")
    return config_ref.render(UpConfig, title="`fleetgate up` configuration", intro=intro,
                             source="`fleetgate/local/config.py`", banner=banner)


def _crd(banner: str) -> str:
    from fleetgate.docsgen import crd_ref

    return crd_ref.render(banner)


def _cli(banner: str) -> str:
    from fleetgate.docsgen import cli_ref

    return cli_ref.render(banner)


def _metrics(banner: str) -> str:
    from fleetgate.docsgen import metrics_ref

    return metrics_ref.render(banner)


def _helm(banner: str) -> str:
    from fleetgate.docsgen import helm_ref

    return helm_ref.render(banner)


# File under docs/reference/ -> (generator, what it is generated from).
PAGES: dict[str, tuple[Callable[[str], str], str]] = {
    "inferenceservice.md": (_crd, "the InferenceService spec models and the CRD schema"),
    "gateway-config.md": (_gateway, "GatewaySettings and the routing plugin registry"),
    "up-config.md": (_up, "UpConfig"),
    "cli.md": (_cli, "the CLI's argparse parsers"),
    "metrics.md": (_metrics, "the metric constructors in the source"),
    "helm-values.md": (_helm, "charts/fleetgate/values.schema.json and values.yaml"),
}


def generate(name: str) -> str:
    """One page's Markdown as the code gives it now (the same text wherever it is run)."""
    render, source = PAGES[name]
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)  # defaults such as relative paths read the same from any directory
        return render(BANNER.format(source=source))
    finally:
        os.chdir(cwd)


def stale() -> list[str]:
    """Pages whose committed copy differs from what the code gives."""
    out = []
    for name in PAGES:
        path = REFERENCE / name
        if not path.is_file() or path.read_text(encoding="utf-8") != generate(name):
            out.append(name)
    return out


def write() -> list[str]:
    REFERENCE.mkdir(parents=True, exist_ok=True)
    changed = []
    for name in PAGES:
        text, path = generate(name), REFERENCE / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetgate.docsgen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is stale; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for name in bad:
            print(f"docs/reference/{name} is stale: run `make docs-ref` (python -m fleetgate.docsgen)")
        return 1 if bad else 0
    for name in write():
        print(f"wrote docs/reference/{name}")
    return 0
