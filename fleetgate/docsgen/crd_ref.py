"""The InferenceService reference: every spec field from the CRD's own schema, then the status.

The spec tables walk `fleetgate.operator.crd.spec_schema()`, the structural schema the CRD ships, derived
from the same pydantic models the operator validates with: so type, default, bounds, enum, pattern and CEL
rules are exactly what the API server enforces. Status fields come from the CRD's status schema, the status
the operator writes (`operator/status.py`: keys of a sample status) and `status.capacityPlan` from the plan's
own dataclass (`fleetgate.engine.capacity.CapacityPlan`), with the trailing comment of each field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from fleetgate.docsgen.comments import field_comments
from fleetgate.docsgen.markdown import cell, code, table, value

ROOT = Path(__file__).resolve().parents[2]

_BOUNDS = (("minimum", "exclusiveMinimum", ">"), ("maximum", "exclusiveMaximum", "<"))


def schema_type(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    if kind == "array":
        items = node.get("items", {})
        return f"array of {schema_type(items)}"
    if kind == "object" and "additionalProperties" in node and "properties" not in node:
        inner = node["additionalProperties"]
        return f"map of {schema_type(inner)}" if isinstance(inner, dict) else "map"
    return str(kind)


def validation(node: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "enum" in node:
        out.append("one of " + ", ".join(code(json.dumps(v)) for v in node["enum"]))
    for key, exclusive, sign in _BOUNDS:
        if key in node:
            out.append(f"{sign}{'' if node.get(exclusive) else '='} {node[key]}")
    for key, text in (("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="),
                      ("maxItems", "items <=")):
        if key in node:
            out.append(f"{text} {node[key]}")
    if "pattern" in node:
        out.append("matches " + code(node["pattern"]))
    if node.get("x-kubernetes-list-type") == "map":
        out.append("unique by " + ", ".join(code(k) for k in node.get("x-kubernetes-list-map-keys", [])))
    return out


def _objects(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, object node) for every object with properties, depth first; array items get `[]`."""
    out = [(path, node)]
    for name, child in node.get("properties", {}).items():
        sub = f"{path}.{name}"
        if child.get("type") == "array" and "properties" in child.get("items", {}):
            out += _objects(child["items"], f"{sub}[]")
        elif "properties" in child:
            out += _objects(child, sub)
    return out


def field_rows(node: dict[str, Any], path: str) -> list[tuple[str, str, str, str, str]]:
    required = set(node.get("required", []))
    rows = []
    for name, child in node.get("properties", {}).items():
        full = f"{path}.{name}"
        if "default" in child:
            default = value(child["default"])
        elif name in required:
            default = "required"
        else:
            default = "unset"
        described = "properties" in child or "properties" in child.get("items", {})
        target = _anchor(full + ("[]" if child.get("type") == "array" else ""))
        see = f" See [{code(full)}](#{target})." if described else ""
        rows.append((code(full), cell(schema_type(child)), default, cell("; ".join(validation(child))) or "—",
                     cell(child.get("description", "")) + see))
    return rows


def _anchor(path: str) -> str:
    """The heading id MkDocs gives `## \\`path\\`` (toc's slugify keeps word characters and hyphens)."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_")


def rules(node: dict[str, Any]) -> list[str]:
    return [f"- {code(r['rule'])}: {r['message']}" for r in node.get("x-kubernetes-validations", [])]


def spec_sections() -> list[str]:
    from fleetgate.operator.crd import spec_schema

    parts: list[str] = []
    for path, node in _objects(spec_schema(), "spec"):
        parts += [f"### `{path}`", ""]
        if node.get("description"):
            parts += [cell(node["description"]), ""]
        checks = rules(node)
        if checks:
            parts += ["Rules the API server checks (and the operator too):", "", *checks, ""]
        parts += [table(("Field", "Type", "Default", "Validation", "Description"), field_rows(node, path)), ""]
    return parts


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


EXAMPLE = "examples/lora-llama-8b-adapters.yaml"


def sample_status() -> dict[str, Any]:
    """The status the operator writes for the LoRA example with both engine pods ready (every key present)."""
    import datetime as dt

    import yaml

    from fleetgate.operator.builders import Owner
    from fleetgate.operator.profiles import load_profiles
    from fleetgate.operator.resolve import resolve
    from fleetgate.operator.spec import parse_spec
    from fleetgate.operator.status import compute_status

    doc = yaml.safe_load((ROOT / EXAMPLE).read_text(encoding="utf-8"))
    spec = parse_spec(doc["spec"])
    owner = Owner(name=doc["metadata"]["name"], namespace="team-a", uid="0", generation=1)
    resolved = resolve(spec=spec, name=owner.name, profiles=load_profiles(path=None))
    replicas = spec.replicas
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": replicas},
                  "status": {"observedGeneration": 1, "readyReplicas": replicas, "updatedReplicas": replicas}}
    return compute_status(owner=owner, spec=spec, resolved=resolved, invalid=None, deployment=deployment,
                          previous=None, now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), adapters=[], shared_with=())


def capacity_plan_rows(plan: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """One row per key of a written plan; the description is the dataclass field's comment."""
    from fleetgate.engine.capacity import CapacityPlan

    comments = {_camel(f.name): (str(f.type), field_comments(CapacityPlan).get(f.name, ""))
                for f in dataclasses.fields(CapacityPlan)}
    rows = []
    for key, sample in plan.items():
        kind, text = comments.get(key, (type(sample).__name__, ""))
        if key not in comments and key.replace("Gb", "Bytes") in comments:
            kind, text = "string", f"{code(key.replace('Gb', 'Bytes'))} in GB (10^9 bytes), two decimals"
        if key == "note":
            text = "how the plan was made: the architecture's source and the accelerator profile"
        rows.append((code(key), cell(kind), value(sample) if key not in ("reason", "note") else "(text)",
                     cell(text) or "—"))
    return rows


def status_rows(status: dict[str, Any]) -> list[tuple[str, str, str]]:
    from fleetgate.operator.crd import status_schema

    described = status_schema()["properties"]
    rows = []
    for key, sample in status.items():
        kind = described.get(key, {}).get("type") or ("list" if isinstance(sample, list) else
                                                        "object" if isinstance(sample, dict) else "string")
        text = described.get(key, {}).get("description", "")
        if key == "capacityPlan":
            text = "the capacity plan, written before any pod exists: see [below](#statuscapacityplan)"
        elif key == "conditions":
            text = "types: " + ", ".join(code(c["type"]) for c in sample)
        rows.append((code(f"status.{key}"), kind, cell(text) or "—"))
    return rows


def profile_rows() -> list[tuple[str, ...]]:
    from fleetgate.operator.profiles import DEFAULT_ACCELERATOR, load_profiles

    rows: list[tuple[str, ...]] = []
    for name, p in load_profiles(path=None).by_name.items():
        memory = f"{p.gpu_memory_bytes / 2**30:.1f} GiB per GPU" if p.is_gpu else f"{p.kv_cache_space_gib} GiB KV space"
        selector = ", ".join(code(f"{k}={v}") for k, v in p.node_selector.items()) or "—"
        label = code(name) + (" (default)" if name == DEFAULT_ACCELERATOR else "")
        rows.append((label, memory, code(p.resource_name) if p.resource_name else "—", selector,
                     str(p.kv_block_size), str(p.max_num_batched_tokens)))
    return rows


def render(banner: str) -> str:
    from fleetgate.operator.crd import ROOT_RULES, build_crd

    crd = build_crd()
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    status = sample_status()
    columns = [(code(c["name"]), code(c["jsonPath"])) for c in version.get("additionalPrinterColumns", [])]
    parts = [
        banner, "",
        "# InferenceService reference", "",
        f"`apiVersion: {crd['spec']['group']}/{version['name']}`, `kind: {names['kind']}`, scope "
        f"{crd['spec']['scope']}, short names {', '.join(code(n) for n in names.get('shortNames', []))}. "
        "Generated from the typed spec the operator validates with (`operator/spec.py`, `operator/spec_pod.py`) "
        "through the CRD schema `fleetgate crd` prints: the types, defaults, bounds and rules below are the API "
        "server's. How to write one: [the InferenceService guide](../guides/inferenceservices.md).", "",
        "`kubectl get fgis` columns:", "", table(("Column", "From"), columns), "",
        "Rules on the whole object:", "", *[f"- {code(r['rule'])}: {r['message']}" for r in ROOT_RULES], "",
        "## Spec", "",
        *spec_sections(),
        "## Accelerator profiles", "",
        "`spec.resources.accelerator` names one of these built-in profiles (`fleetgate operator --profiles FILE`, "
        "chart value `operator.acceleratorProfiles`, adds or overrides them). The plan takes the GPU memory and the "
        "KV block size from the profile.", "",
        table(("Profile", "Memory", "Resource", "Node selector", "KV block (tokens)", "Batched tokens"),
              profile_rows()), "",
        "## Status", "",
        f"What the operator writes, shown for `{EXAMPLE}` with its two engine pods ready. How to read it: "
        "[the capacity plan guide](../guides/capacity-plan.md).", "",
        table(("Field", "Type", "Description"), status_rows(status)), "",
        "### `status.capacityPlan`", "",
        f"Keys as written for `{EXAMPLE}` (LoRA on, so the LoRA keys are present; they are absent otherwise).", "",
        table(("Key", "Type", "Example", "Description"), capacity_plan_rows(status["capacityPlan"])), "",
    ]
    return "\n".join(parts) + "\n"
