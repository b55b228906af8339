"""Which measured entry prices which tier: several throughput files merged, and `--tier-entry TIER=SELECTOR`.

`fleetgate bench cost --throughput A.json --throughput B.json` reads every file; their entries are pooled
in the order given (each remembers its file and that file's vLLM version). Without a selector a tier takes
its default entry (`cost_measured.candidates`: its model shape, unquantized, the model dtype's KV cache).
`--tier-entry TIER=SELECTOR` names the entry instead, whatever its precision or parallelism, e.g. the 70B
measured in fp8 on tensor parallel 2 for the large tier, which by default (bf16, TP4) has no entry on a
two-GPU machine. A SELECTOR is either

- an entry's `name` (the GPU tier's configuration name, e.g. `llama70b-fp8-tp2`), or
- `SHAPE/QUANTIZATION/tpN`, optionally followed by `/compiled` or `/eager`
  (e.g. `llama-3.1-70b/fp8/tp2/compiled`; QUANTIZATION `none` for unquantized weights),

optionally followed by `@K`, the K-th `--throughput` file (1-based), when the same entry is in two files.
A selector must match exactly one entry with points, of the tier's own model shape; otherwise it is an
error (`SelectorError`, one line naming what did match).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile

_SHAPE_FORM = re.compile(r"^(?P<shape>[^/@]+)/(?P<quant>[^/@]+)/tp(?P<tp>\d+)(?:/(?P<mode>compiled|eager))?$")


class SelectorError(ValueError):
    """A `--tier-entry` that is malformed, names no tier, or matches no entry or several."""


@dataclass(frozen=True, slots=True)
class SourcedEntry:
    """A measured entry with the file it came from (1-based position among the --throughput files)."""

    entry: ThroughputEntry
    vllm_version: str
    source: str
    file_index: int


@dataclass(frozen=True, slots=True)
class Selector:
    text: str  # as the user wrote it (for messages and the label)
    name: str | None = None
    shape: str | None = None
    quantization: str | None = None
    tensor_parallel_size: int | None = None
    eager: bool | None = None  # None: either
    file_index: int | None = None

    def matches(self, sourced: SourcedEntry) -> bool:
        e = sourced.entry
        if self.file_index is not None and sourced.file_index != self.file_index:
            return False
        if self.name is not None:
            return e.name == self.name
        return ((e.model_shape, e.quantization, e.tensor_parallel_size) == (self.shape, self.quantization,
                self.tensor_parallel_size) and (self.eager is None or e.enforce_eager == self.eager))  # fmt: skip


def merge(files: Sequence[tuple[str, ThroughputFile]]) -> tuple[SourcedEntry, ...]:
    """Every entry of every file, in the order given; `files` are (source name, file) pairs."""
    return tuple(SourcedEntry(entry=e, vllm_version=data.vllm_version, source=source, file_index=i)
                 for i, (source, data) in enumerate(files, start=1) for e in data.entries)  # fmt: skip


def parse_selector(text: str) -> Selector:
    """One SELECTOR (see the module docstring)."""
    body, at, index = text.partition("@")
    file_index: int | None = None
    if at:
        if not index.isdigit() or int(index) < 1:
            raise SelectorError(f"selector {text!r}: after @ comes a --throughput file's position (1, 2, ...)")
        file_index = int(index)
    if not body:
        raise SelectorError(f"selector {text!r} is empty")
    if "/" not in body:
        return Selector(text=text, name=body, file_index=file_index)
    m = _SHAPE_FORM.match(body)
    if m is None:
        raise SelectorError(f"selector {text!r}: expected an entry name or SHAPE/QUANTIZATION/tpN[/compiled|/eager]")
    eager = None if m["mode"] is None else m["mode"] == "eager"
    return Selector(text=text, shape=m["shape"], quantization=m["quant"], tensor_parallel_size=int(m["tp"]),
                    eager=eager, file_index=file_index)  # fmt: skip


def parse_tier_entries(values: Sequence[str], *, tiers: Sequence[str]) -> dict[str, Selector]:
    """`--tier-entry` values (`TIER=SELECTOR`) by tier; each tier at most once, every tier one of `tiers`."""
    out: dict[str, Selector] = {}
    for value in values:
        tier, eq, selector = value.partition("=")
        if not eq or not tier:
            raise SelectorError(f"--tier-entry {value!r}: expected TIER=SELECTOR (tiers: {', '.join(tiers)})")
        if tier not in tiers:
            raise SelectorError(f"--tier-entry {value!r}: no tier {tier!r} (tiers: {', '.join(tiers)})")
        if tier in out:
            raise SelectorError(f"--tier-entry: the {tier} tier is given twice")
        out[tier] = parse_selector(selector)
    return out


def select(selector: Selector, entries: Sequence[SourcedEntry], *, tier: str, model_shape: str) -> SourcedEntry:
    """The one entry `selector` matches among those with points, which must be of the tier's model shape."""
    found = [s for s in entries if s.entry.points and selector.matches(s)]
    where = f"--tier-entry {tier}={selector.text}"
    if not found:
        names = ", ".join(sorted({s.entry.name for s in entries if s.entry.points})) or "none"
        raise SelectorError(f"{where} matches no entry with points (entries: {names})")
    if len(found) > 1:
        listed = ", ".join(f"{s.entry.name} (file {s.file_index}, {s.source})" for s in found)
        raise SelectorError(f"{where} matches {len(found)} entries: {listed}; name one, add /compiled or /eager, "
                            f"or @K for the K-th --throughput file")  # fmt: skip
    chosen = found[0]
    if chosen.entry.model_shape != model_shape:
        raise SelectorError(f"{where}: entry {chosen.entry.name} measured {chosen.entry.model_shape}, but the {tier} "
                            f"tier serves {model_shape}")  # fmt: skip
    return chosen


def selected(
    selectors: Mapping[str, Selector], entries: Sequence[SourcedEntry], *, models: Mapping[str, str]
) -> dict[str, SourcedEntry]:
    """The entry each selector picks; `models` is each tier's model shape."""
    return {tier: select(s, entries, tier=tier, model_shape=models[tier]) for tier, s in selectors.items()}
