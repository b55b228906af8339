"""The code blocks the docs and the README mark as meant to work (`<!-- check: KIND -->`) do work.

Configuration blocks are loaded by the same models the gateway, `fleetgate up` and the operator use; Helm
values are validated against the chart's schema (merged over `values.yaml`, as Helm does); alert rules must
parse as PromQL and name metrics the gateway exports; `commands` blocks must name real `fleetgate`
commands and options, real `make` targets and files that exist; `run` blocks are run and must exit 0.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO, Block, all_blocks, marked_blocks

KINDS = {"gateway-config", "up-config", "inferenceservice", "helm-values", "prometheus-rules", "commands", "run"}
BLOCKS = all_blocks()


def _ids(kind: str) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.kind == kind]


def test_every_marker_is_known_and_the_docs_mark_each_kind() -> None:
    assert {b.kind for b in BLOCKS} <= KINDS, {b.where: b.kind for b in BLOCKS if b.kind not in KINDS}
    assert {b.kind for b in BLOCKS} == KINDS  # each checker has something to check


def test_a_marker_without_a_block_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- check: run -->\nno block here\n")
    with pytest.raises(AssertionError, match="must precede"):
        marked_blocks(page)


@pytest.mark.parametrize("block", _ids("gateway-config"))
def test_gateway_config_blocks_load(block: Block) -> None:
    from fleetgate.gateway.settings import GatewaySettings

    GatewaySettings.model_validate(yaml.safe_load(block.text))


@pytest.mark.parametrize("block", _ids("up-config"))
def test_up_config_blocks_load(block: Block) -> None:
    from fleetgate.local.config import UpConfig

    UpConfig.model_validate(yaml.safe_load(block.text))


@pytest.mark.parametrize("block", _ids("inferenceservice"))
def test_inferenceservice_blocks_are_valid_specs(block: Block) -> None:
    from fleetgate.operator.profiles import load_profiles
    from fleetgate.operator.resolve import resolve
    from fleetgate.operator.spec import parse_spec

    doc = yaml.safe_load(block.text)
    assert doc["apiVersion"] == "fleetgate.io/v1alpha1" and doc["kind"] == "InferenceService"
    spec = parse_spec(doc["spec"])
    resolved = resolve(spec=spec, name=doc["metadata"]["name"], profiles=load_profiles(path=None))
    assert resolved.plan is not None and resolved.plan.fits, f"{block.where}: the example does not fit its GPUs"


def _merged(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for key, value in override.items():
            out[key] = _merged(base.get(key), value) if key in base else value
        return out
    return override


@pytest.mark.parametrize("block", _ids("helm-values"))
def test_helm_values_blocks_pass_the_chart_schema(block: Block) -> None:
    import jsonschema

    chart = REPO / "charts" / "fleetgate"
    schema = json.loads((chart / "values.schema.json").read_text())
    values = _merged(yaml.safe_load((chart / "values.yaml").read_text()), yaml.safe_load(block.text))
    jsonschema.validate(values, schema)


def _exported_metrics() -> set[str]:
    from fleetgate.docsgen import metrics_ref

    return {m.name for m in metrics_ref.collect()}


@pytest.mark.parametrize("block", _ids("prometheus-rules"))
def test_alert_rules_parse_and_name_exported_metrics(block: Block) -> None:
    import promql_parser

    exported = _exported_metrics()
    rules = [r for g in yaml.safe_load(block.text)["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        promql_parser.parse(rule["expr"])
        for name in re.findall(r"\b(fleetgate_\w+|llm_\w+)", rule["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or base in exported, f"{block.where}: {rule['alert']} uses unknown {name}"


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z][\w-]*):", text, re.M)}


def _fleetgate_parser(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser `fleetgate` builds for `words` (its nested dispatch tables followed), and the rest."""
    from fleetgate import cli
    from fleetgate.docsgen.cli_ref import DISPATCH_TABLES

    table, prog, rest = cli.COMMANDS, "fleetgate", words
    while True:
        assert rest and rest[0] in table, f"unknown command {prog} {rest[:1]}"
        module_name, _help = table[rest[0]]
        module = importlib.import_module(module_name)
        prog, rest = f"{prog} {rest[0]}", rest[1:]
        nested = next((getattr(module, t) for t in DISPATCH_TABLES if isinstance(getattr(module, t, None), dict)),
                      None)
        if nested is None or module is cli:
            parser = argparse.ArgumentParser(prog=prog, exit_on_error=False)
            module.add_arguments(parser)
            return parser, rest
        table = nested


def _logical_lines(text: str) -> list[str]:
    """Shell lines with continuations joined and here-document bodies dropped."""
    out: list[str] = []
    heredoc: str | None = None
    pending = ""
    for raw in text.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        match = re.search(r"<<-?\s*'?(\w+)'?", line)
        if match:
            heredoc = match.group(1)
        out.append(line.split(" #", 1)[0].strip())
    return [line for line in out if line and not line.startswith("#")]


def _check_command(words: list[str], where: str) -> None:
    if words[0] == "make":
        targets = _make_targets()
        for target in [w for w in words[1:] if "=" not in w]:
            assert target in targets, f"{where}: make has no target {target!r}"
        return
    if words[0] in ("fleetgate", ".venv/bin/fleetgate"):
        parser, rest = _fleetgate_parser([w.strip("[]") for w in words[1:] if w not in ("[", "]")])
        try:
            parser.parse_args(rest)
        except (argparse.ArgumentError, SystemExit) as exc:
            raise AssertionError(f"{where}: `{shlex.join(words)}` does not parse: {exc}") from None
    for word in words:
        if word.startswith(("examples/", "charts/")):
            matches = list(REPO.glob(word)) if "*" in word else [REPO / word]
            assert matches and all(m.exists() for m in matches), f"{where}: {word} does not exist"


@pytest.mark.parametrize("block", _ids("commands"))
def test_command_blocks_name_real_commands_options_and_files(block: Block) -> None:
    checked = 0
    for line in _logical_lines(block.text):
        for part in re.split(r"\s*(?:&&|;|\|\|?)\s*", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]  # leading VAR=value assignments
            if words and words[0] in ("make", "fleetgate", ".venv/bin/fleetgate", "kubectl", "helm"):
                _check_command(words, block.where)
                checked += 1
    assert checked, f"{block.where}: no command in the block"


def test_the_command_checker_refuses_a_wrong_option() -> None:
    with pytest.raises(AssertionError, match="does not parse"):
        _check_command(["fleetgate", "plan", "--no-such-option", "x.yaml"], "here")
    with pytest.raises(AssertionError, match="no target"):
        _check_command(["make", "deploy"], "here")
    with pytest.raises(AssertionError, match="does not exist"):
        _check_command(["kubectl", "apply", "-f", "examples/nope.yaml"], "here")


def _run(block: Block) -> subprocess.CompletedProcess[str]:
    script = block.text.replace(".venv/bin/python", shlex.quote(sys.executable))
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONSAFEPATH": "1"})


@pytest.mark.parametrize("block", _ids("run"))
def test_run_blocks_exit_zero(block: Block) -> None:
    result = _run(block)
    assert result.returncode == 0, f"{block.where}: exit {result.returncode}\n{result.stderr}"


def test_both_ways_to_create_a_tenant_key_print_a_key_and_its_gateway_hash() -> None:
    from fleetgate.gateway.tenancy.config import TenantConfig
    from fleetgate.gateway.tenancy.keys import hash_key

    blocks = [b for b in marked_blocks(REPO / "docs" / "guides" / "tenants.md") if b.kind == "run"]
    assert len(blocks) == 2
    for block in blocks:
        key, hashed = _run(block).stdout.split()[-2:]
        assert key.startswith("fg-") and hashed == hash_key(key)
        TenantConfig(id="t", key_hashes=[hashed])  # the gateway accepts it as configured
