"""The metrics reference: every Prometheus metric FleetGate exports, with its type, labels and help text.

Read from the source, so that no metric is missed for want of a configuration that builds it: every call
to a prometheus_client metric class (`Counter`, `Gauge`, `Histogram`, `Summary`, `Info`, `Enum`, a
`*MetricFamily`) or to the router's `TimingHistogram` in the package is found with `ast`; its name,
help and label names are literals or module-level constants, evaluated in the module's namespace (a
metric whose name cannot be known that way is an error naming the file and line: metric names must not
depend on run-time values). The simulated engines (`fleetgate/sim`) export vLLM's names, not FleetGate's,
and are left out. The test suite cross-checks the result against a real gateway's registry.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgate.docsgen.markdown import cell, code, table

ROOT = Path(__file__).resolve().parents[2]
# Source folder -> module prefix (setup.py's package_dir mapping).
PACKAGES = {"fleetgate": "fleetgate", "gateway": "fleetgate.gateway", "router": "fleetgate.router",
            "cache": "fleetgate.cache", "operator": "fleetgate.operator"}
SKIP = ("fleetgate/sim/", "fleetgate/docsgen/", "fleetgate/bench/")
KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary", "Info": "info",
         "Enum": "stateset", "TimingHistogram": "histogram", "CounterMetricFamily": "counter",
         "GaugeMetricFamily": "gauge", "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary",
         "InfoMetricFamily": "info"}
SUFFIX = {"counter": "_total", "info": "_info"}


@dataclass(frozen=True)
class Metric:
    name: str  # as scraped (a counter's `_total` included)
    kind: str
    labels: tuple[str, ...]
    help: str
    source: str  # file:line


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    prefix = PACKAGES[rel.parts[0]]
    parts = [*prefix.split("."), *rel.parts[1:-1]]
    if rel.stem != "__init__":
        parts.append(rel.stem)
    return ".".join(dict.fromkeys(parts)) if rel.parts[0] == "fleetgate" else ".".join(parts)


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return eval(compile(ast.Expression(node), "<metric>", "eval"), dict(namespace))  # module constants only


def _is_metric_class(func: ast.expr, namespace: dict[str, Any]) -> bool:
    """The callee is prometheus_client's (or our collector), not a namesake such as collections.Counter."""
    try:
        target = _evaluate(func, namespace)
    except Exception:
        return False
    module = getattr(target, "__module__", "") or ""
    return module.startswith("prometheus_client") or module == "fleetgate.router.timing"


def _arguments(call: ast.Call, kind: str) -> dict[str, ast.expr]:
    names = ["name", "documentation", "labelnames"] if not kind.endswith("MetricFamily") else ["name", "documentation"]
    out = dict(zip(names, call.args, strict=False))
    for kw in call.keywords:
        if kw.arg in ("name", "documentation", "labelnames", "namespace", "subsystem"):
            out[kw.arg] = kw.value
        elif kw.arg == "labels":
            out["labelnames"] = kw.value
    return out


def _metrics_in(path: Path) -> list[Metric]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    found = [(c, c.func.id if isinstance(c.func, ast.Name) else c.func.attr) for c in calls
             if isinstance(c.func, (ast.Name, ast.Attribute))]
    found = [(c, f) for c, f in found if f in KINDS and c.args]
    if not found:
        return []
    namespace = vars(importlib.import_module(_module_of(path)))
    found = [(c, f) for c, f in found if _is_metric_class(c.func, namespace)]
    out = []
    for call, func in found:
        args = _arguments(call, func)
        where = f"{path.relative_to(ROOT)}:{call.lineno}"
        if isinstance(args["name"], ast.Attribute) and ast.unparse(args["name"]).startswith("self."):
            continue  # a collector re-emitting its own family (TimingHistogram.collect): found at its constructor
        try:
            values = {k: _evaluate(v, namespace) for k, v in args.items()}
        except Exception as exc:
            raise ValueError(f"{where}: a metric's name, help and labels must be literals or module constants "
                             f"({exc})") from None
        kind = KINDS[func]
        name = "_".join(str(values[k]) for k in ("namespace", "subsystem") if values.get(k)) or ""
        name = f"{name}_{values['name']}" if name else str(values["name"])
        suffix = SUFFIX.get(kind, "")
        name = name.removesuffix(suffix) + suffix
        out.append(Metric(name=name, kind=kind, labels=tuple(values.get("labelnames") or ()),
                          help=str(values.get("documentation", "")), source=where))
    return out


def collect() -> list[Metric]:
    metrics: dict[str, Metric] = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP) or "__pycache__" in rel:
                continue
            for metric in _metrics_in(path):
                metrics.setdefault(metric.name, metric)
    return sorted(metrics.values(), key=lambda m: m.name)


def _group(metric: Metric) -> str:
    top = metric.source.split("/", 1)[0]
    if "tenancy" in metric.source:
        return "Tenants, budgets and cost"
    return {"gateway": "Gateway", "router": "Routing and tiers", "cache": "Response cache",
            "operator": "Operator", "fleetgate": "Local stack and core"}.get(top, top)


def render(banner: str) -> str:
    metrics = collect()
    groups: dict[str, list[Metric]] = {}
    for m in metrics:
        groups.setdefault(_group(m), []).append(m)
    parts = [banner, "", "# Metrics", "",
             f"All {len(metrics)} Prometheus metrics the gateway and its stages export, found in the source where "
             "they are created. The gateway serves them on its own port (`server.metrics_port`, 9464), never on "
             "the client port. Histograms also expose `_bucket`, `_sum` and `_count` series. What to do with "
             "them: [operations](../guides/operations.md).", ""]
    for title, members in groups.items():
        rows = [(code(m.name), m.kind, ", ".join(code(x) for x in m.labels) or "—", cell(m.help) or "—",
                 code(m.source)) for m in members]
        parts += [f"## {title}", "", table(("Metric", "Type", "Labels", "Help", "Defined in"), rows), ""]
    return "\n".join(parts) + "\n"
