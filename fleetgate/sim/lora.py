"""LoRA adapters of a simulated engine: the registry, the CPU cache and the GPU slots, modelled on vLLM.

vLLM (`--enable-lora`) keeps three sets, and so does `LoraSlots`:
- *registered*: the adapters the server knows by name (`--lora-modules` at start-up, then
  `POST /v1/load_lora_adapter` / `unload_lora_adapter`); `/v1/models` lists exactly these.
- *CPU cache*: adapters whose weights sit in host memory, at most `max_cpu_loras` (vLLM's default is
  `max_loras`), least recently used evicted first. An adapter evicted from it stays registered; using it
  again reloads it from disk (`lora_load_s`).
- *GPU slots*: `max_loras` slots. A batch can only hold sequences of at most `max_loras` distinct
  adapters, so a request whose adapter would be one too many waits (vLLM's scheduler skips it and looks
  at the next waiting request). Putting an adapter into a slot copies it from the CPU cache
  (`lora_activate_s`), after loading it from disk first when it is not cached; the slot of the least
  recently used adapter that no sequence of the batch needs is reused.

No clock here: `activate` returns the engine seconds the swap-in costs and the engine adds them to the
step that admits the request (vLLM loads adapters synchronously before running the batch, so the whole
batch waits).

Each adapter gets a distinct integer id, like vLLM's `lora_int_id`, which the engine mixes into the
prefix-cache block hashes: two adapters never share KV blocks, as their keys and values differ.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass


class LoraError(Exception):
    """A refused adapter operation; `status` is the HTTP status vLLM answers with."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class SimAdapter:
    name: str
    path: str
    rank: int
    int_id: int  # vLLM's lora_int_id: distinct per registration, part of every block hash


class LoraSlots:
    def __init__(self, *, max_loras: int, max_cpu_loras: int, max_lora_rank: int) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if max_cpu_loras < max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras (as vLLM requires)")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self.registered: dict[str, SimAdapter] = {}
        self.cpu: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.gpu: OrderedDict[str, None] = OrderedDict()
        self._ids = itertools.count(1)
        self.disk_loads = 0  # loads from disk (registration and reloads after CPU eviction)
        self.activations = 0  # copies into a GPU slot

    def check_new(self, *, name: str, rank: int) -> None:
        """Raise the error vLLM answers a load of `name` with, if any."""
        if name in self.registered:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.", status=400)
        if rank > self.max_lora_rank:
            raise LoraError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.", status=400)

    def register(self, *, name: str, path: str, rank: int) -> SimAdapter:
        """Register `name` and put it in the CPU cache (the caller charges the disk load)."""
        self.check_new(name=name, rank=rank)
        adapter = SimAdapter(name=name, path=path, rank=rank, int_id=next(self._ids))
        self.registered[name] = adapter
        self._cache_on_cpu(name, keep=frozenset())
        self.disk_loads += 1
        return adapter

    def unregister(self, name: str) -> None:
        if self.registered.pop(name, None) is None:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", status=404)
        self.cpu.pop(name, None)
        self.gpu.pop(name, None)

    def can_admit(self, name: str, batch: set[str]) -> bool:
        """Whether a sequence of adapter `name` fits a batch already using adapters `batch`."""
        return name in batch or len(batch) < self.max_loras

    def touch(self, names: set[str]) -> None:
        """The batch uses `names` this step: most recently used in both caches."""
        for name in names:
            if name in self.gpu:
                self.gpu.move_to_end(name)
            if name in self.cpu:
                self.cpu.move_to_end(name)

    def activate(self, name: str, *, batch: set[str], load_s: float, activate_s: float) -> float:
        """Make `name` resident in a GPU slot for a batch using `batch` (which `can_admit` allowed);
        returns the engine seconds this costs (0 when it is resident already)."""
        if name in self.gpu:
            self.gpu.move_to_end(name)
            if name in self.cpu:
                self.cpu.move_to_end(name)
            return 0.0
        cost = activate_s
        if name not in self.cpu:
            self._cache_on_cpu(name, keep=frozenset(batch))
            self.disk_loads += 1
            cost += load_s
        else:
            self.cpu.move_to_end(name)
        if len(self.gpu) >= self.max_loras:
            victim = next((a for a in self.gpu if a not in batch), None)
            if victim is not None:
                del self.gpu[victim]
        self.gpu[name] = None
        self.activations += 1
        return cost

    def _cache_on_cpu(self, name: str, *, keep: frozenset[str]) -> None:
        """Add `name` to the CPU cache, evicting the least recently used adapters not in a GPU slot and
        not in `keep` (vLLM's CPU cache holds every active adapter)."""
        while len(self.cpu) >= self.max_cpu_loras:
            victim = next((a for a in self.cpu if a not in self.gpu and a not in keep), None)
            if victim is None:
                victim = next((a for a in self.cpu if a not in keep), None)
                if victim is None:  # every cached adapter is in use by the batch: hold one more
                    break
                self.gpu.pop(victim, None)
            del self.cpu[victim]
        self.cpu[name] = None


def adapter_rank(path: str, *, default: int) -> int:
    """The rank `r` in `<path>/adapter_config.json` (peft's format) when that file exists and says so,
    else `default`: a simulated engine may be given paths that hold no adapter."""
    import json
    from pathlib import Path

    config = Path(path) / "adapter_config.json"
    try:
        if config.is_file() and config.stat().st_size < 1_000_000:
            rank = json.loads(config.read_text(encoding="utf-8")).get("r")
            if isinstance(rank, int) and rank > 0:
                return rank
    except (OSError, ValueError, AttributeError):
        pass
    return default


def parse_lora_module(spec: str) -> tuple[str, str]:
    """One `--lora-modules` value, as vLLM takes it: `name=path` or JSON `{"name": ..., "path": ...}`."""
    import json

    if spec.lstrip().startswith("{"):
        data = json.loads(spec)
        name, path = data.get("name"), data.get("path")
    else:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"--lora-modules expects name=path, got {spec!r}")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ValueError(f"--lora-modules entry needs a name and a path: {spec!r}")
    return name, path
