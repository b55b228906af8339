"""The Helm values reference: every key of the chart, from `values.schema.json` and `values.yaml`.

The schema gives the keys, types and validation (what `helm install` refuses); `values.yaml` gives the
defaults and, from its `# --` comments (the helm-docs convention the chart follows), the descriptions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from fleetgate.docsgen.crd_ref import validation
from fleetgate.docsgen.markdown import cell, code, table, value

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fleetgate"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-]+):(\s|$)")
_DOC = re.compile(r"^(\s*)#\s?(.*)$")


def value_comments(text: str) -> dict[str, str]:
    """Dotted key path -> its `# --` comment block in values.yaml."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    doc: list[str] | None = None
    for line in text.splitlines():
        comment, key = _DOC.match(line), _KEY.match(line)
        if comment:
            body = comment.group(2)
            if body.startswith("-- "):
                doc = [body[3:]]
            elif doc is not None:
                doc.append(body)
            continue
        if key:
            indent = len(key.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key.group(2)))
            if doc is not None:
                out[".".join(k for _, k in stack)] = " ".join(doc)
        doc = None if not line.strip().startswith("- ") else doc
    return out


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def _lookup(values: Any, path: list[str]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return False, None
        values = values[part]
    return True, values


def rows(schema: dict[str, Any], values: dict[str, Any], docs: dict[str, str]) -> dict[str, list[tuple[str, ...]]]:
    """Top-level section -> rows of (key, type, default, description)."""
    out: dict[str, list[tuple[str, ...]]] = {}

    def walk(node: dict[str, Any], path: list[str]) -> None:
        node = _resolve(node, schema)
        props = node.get("properties")
        dotted = ".".join(path)
        if props and path:
            for name, child in props.items():
                walk(child, [*path, name])
            return
        if props:
            for name, child in props.items():
                walk(child, [name])
            return
        found, default = _lookup(values, path)
        checks = "; ".join(validation(node))
        text = docs.get(dotted, node.get("description", ""))
        text = f"{text} ({checks})" if checks and text else (text or checks)
        section = path[0] if len(path) > 1 else "Top level"
        out.setdefault(section, []).append((code(dotted), cell(_type(node)), value(default) if found else "unset",
                                            cell(text) or "—"))

    walk(schema, [])
    return out


def all_keys() -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return [r[0].strip("`") for rs in rows(schema, values, {}).values() for r in rs]


def render(banner: str) -> str:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    sections = rows(schema, yaml.safe_load(text), value_comments(text))
    parts = [banner, "", "# Helm values", "",
             "Every value of `charts/fleetgate`, with its default from `values.yaml` and the checks of "
             "`values.schema.json` (an unknown key or a wrong type fails `helm install` with the key's path). "
             "The walkthrough: [install on Kubernetes](../guides/kubernetes.md).", ""]
    for section, section_rows in sections.items():
        parts += [f"## `{section}`" if section != "Top level" else "## Top level", "",
                  table(("Key", "Type", "Default", "Description"), section_rows), ""]
    return "\n".join(parts) + "\n"
