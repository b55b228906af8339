"""The routing plugin types: each registered type, what its module says it does, its parameters and defaults.

Types come from the registry (`fleetgate.router.plugins.registry.PLUGIN_TYPES`); parameters are read from
each factory's source, from its `param(parameters, "name", default, type)` and `parameters.get("name",
default)` calls, so a new plugin or parameter appears here without a line of documentation code.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
from dataclasses import dataclass

from fleetgate.docsgen.markdown import cell, code, first_paragraph, table


@dataclass(frozen=True)
class Param:
    name: str
    default: str
    kind: str


def _literal(node: ast.expr | None) -> str:
    if node is None:
        return "—"
    try:
        return json.dumps(ast.literal_eval(node))
    except (ValueError, TypeError):
        return ast.unparse(node)


def factory_params(factory: object) -> list[Param]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(factory)))  # type: ignore[arg-type]
    out: dict[str, Param] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name_node: ast.expr
        default: ast.expr | None
        if isinstance(func, ast.Name) and func.id == "param" and len(node.args) >= 3:
            name_node, default, kind = node.args[1], node.args[2], node.args[3] if len(node.args) > 3 else None
        elif isinstance(func, ast.Attribute) and func.attr == "get" and ast.unparse(func.value) == "parameters":
            name_node, default, kind = node.args[0], node.args[1] if len(node.args) > 1 else None, None
        else:
            continue
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            out.setdefault(name_node.value, Param(name_node.value, _literal(default),
                                                  ast.unparse(kind) if kind is not None else "any"))
    return list(out.values())


def render_plugins() -> str:
    from fleetgate.router.config import RoutingConfig
    from fleetgate.router.plugins.registry import PLUGIN_TYPES

    config = RoutingConfig()
    profile = config.profile()
    by_ref = {p.ref: p.type for p in config.plugins}
    weights = {by_ref.get(r.plugin_ref, r.plugin_ref): r.weight for r in profile.plugins}
    rows = []
    for type_name, target in PLUGIN_TYPES.items():
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        params = factory_params(getattr(module, attr))
        param_text = "<br>".join(f"{code(p.name)} ({p.kind}, default {code(p.default)})" for p in params) or "—"
        weight = weights.get(type_name)
        shipped = "—" if type_name not in weights else ("yes" if weight is None else f"yes, weight {weight:g}")
        rows.append((code(type_name), cell(first_paragraph(module.__doc__)), param_text, shipped))
    return table(("Type", "What it does", "Parameters", "In the default profile"), rows)
