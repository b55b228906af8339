"""Drift: which fields the operator sets on a child differ in the child as it is now. Pure.

The operator owns exactly the fields of the manifests it applies (server-side apply, one field manager);
everything else on a live child belongs to someone else: the API server's defaults, the Deployment
controller's `status` and revision annotation, an autoscaler's `replicas` (left out of the applied
Deployment when an autoscaler owns it), another manager's extra env var. So drift is "the desired manifest
is not a subset of the live object":

- mappings: every desired key must be present and equal (extra live keys are not ours). A desired zero
  value (False, 0, "", empty list or mapping) also matches an absent live key: the API server omits
  empty fields from what it returns (`publishNotReadyAddresses: false` reads back as absent);
- lists whose desired items all carry a `name` (containers, env, ports, volumes, volume mounts) are
  matched item by item by name, as server-side apply merges them; live items of other names are not
  ours. Other lists (args, command, tolerations, HPA metrics) are atomic: same length, item by item;
- scalars compare equal, and quantity strings by value ("1000m" is "1", "0.5" is "500m"), because the
  API server rewrites quantities into their canonical form.

`drift(desired=..., live=...)` returns the differing fields as paths (`spec.replicas`,
`spec.template.spec.containers[engine].image`, `spec.ports[http].port`) with the live value, in the
order of the desired manifest. Only `metadata.labels`, `metadata.annotations`, `metadata.ownerReferences`
(by uid) and the body outside `metadata`/`status` are compared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}  # fmt: skip
_VALUE_MAX = 80


@dataclass(frozen=True, kw_only=True)
class Drifted:
    """One owned field whose live value differs: its path and what it is now (None: absent)."""

    path: str
    live: Any

    def describe(self) -> str:
        shown = "absent" if self.live is None else repr(self.live)
        if len(shown) > _VALUE_MAX:
            shown = shown[: _VALUE_MAX - 3] + "..."
        return f"{self.path} (was {shown})"


def quantity(value: str) -> Decimal | None:
    """A Kubernetes quantity string as a number, or None when it is not one."""
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        return None


def _is_zero(value: Any) -> bool:
    return value is False or value == 0 or value == "" or value == [] or value == {}


def _same_scalar(want: Any, have: Any) -> bool:
    if isinstance(want, bool) or isinstance(have, bool):
        return want is have
    if want == have:
        return True
    if isinstance(want, str) and isinstance(have, str):
        a, b = quantity(want), quantity(have)
        return a is not None and b is not None and a == b
    return False


def _named(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items)


def _compare(want: Any, have: Any, path: str, out: list[Drifted]) -> None:
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            out.append(Drifted(path=path, live=have))
            return
        for key, value in want.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in have or have[key] is None:
                if not _is_zero(value):
                    out.append(Drifted(path=sub, live=None))
                continue
            _compare(value, have[key], sub, out)
    elif isinstance(want, list):
        if not isinstance(have, list):
            if not (want == [] and have is None):
                out.append(Drifted(path=path, live=have))
            return
        if _named(want):
            live_by_name = {i.get("name"): i for i in have if isinstance(i, Mapping)}
            for item in want:
                sub = f"{path}[{item['name']}]"
                if item["name"] not in live_by_name:
                    out.append(Drifted(path=sub, live=None))
                else:
                    _compare(item, live_by_name[item["name"]], sub, out)
            return
        if len(want) != len(have):
            out.append(Drifted(path=path, live=have))
            return
        before = len(out)
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            _compare(w, h, f"{path}[{index}]", out)
        if len(out) > before and not all(isinstance(w, Mapping) for w in want):
            del out[before:]  # an atomic list of scalars (args, command): report the list, not each item
            out.append(Drifted(path=path, live=have))
    elif not _same_scalar(want, have):
        out.append(Drifted(path=path, live=have))


def drift(*, desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[Drifted]:
    """The owned fields of `desired` that `live` does not hold (see the module docstring)."""
    out: list[Drifted] = []
    want_meta = desired.get("metadata") or {}
    have_meta = live.get("metadata") or {}
    for key in ("labels", "annotations"):
        _compare(want_meta.get(key) or {}, have_meta.get(key) or {}, f"metadata.{key}", out)
    live_refs = {r.get("uid") for r in have_meta.get("ownerReferences") or [] if isinstance(r, Mapping)}
    for ref in want_meta.get("ownerReferences") or []:
        if ref.get("uid") not in live_refs:
            out.append(Drifted(path=f"metadata.ownerReferences[{ref.get('name')}]", live=None))
    for key, value in desired.items():
        if key not in ("metadata", "status", "apiVersion", "kind"):
            _compare(value, live.get(key), key, out)
    return out
