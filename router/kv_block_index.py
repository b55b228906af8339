"""Which prompt blocks one engine really holds, rebuilt from its own KV events (precise prefix routing).

The engine names a block by its own hash; FleetGate names it by `token_block_hashes` over the token ids
the `BlockStored` event carries, chained from the parent block's FleetGate hash (or the LoRA root seed
when the event has no parent). So each endpoint keeps:

- `ours_of`: engine hash -> FleetGate hash, for blocks some medium holds;
- `media`: engine hash -> bit mask of the media holding it (GPU, CPU offload, ...: a prefix offloaded
  to CPU is still a hit, only slower);
- `held`: FleetGate hash -> number of engine blocks that map to it (two engine hashes can share one
  FleetGate hash, e.g. the same tokens under a cache salt FleetGate cannot see).

`BlockStored` maps and adds its blocks; `BlockRemoved` drops them from that medium; `AllBlocksCleared`
empties everything. A stored block whose parent is unknown (stored before this subscriber listened, or
in a lost message) cannot be hashed: it is skipped and counted as an orphan. The index therefore may
miss blocks the engine holds but never claims a block it does not, as long as no `BlockRemoved` was
lost: the subscriber resyncs (clears and replays) on any sequence gap, so that holds.

Only one KV-cache group is followed: hybrid models (sliding-window + full attention, e.g. Gemma 3 on
vLLM CPU: five sliding-window groups and one full-attention group) publish one event per group, and a
long prefix hit needs the full-attention one. `group=None` (auto) follows the first group whose stored
events say `kv_cache_spec_kind` is a full-attention kind (vLLM 0.26+ annotates them), and group 0 (or
no group) from engines that do not annotate; an int pins the group.
Events of another block size than the endpoint's first-seen one (vLLM 0.32's partial-block entries)
and blocks whose `extra_keys` hold more than the LoRA name (multimodal inputs, cache salt: requests
the gateway cannot hash) are skipped, which again only under-counts. `max_blocks` bounds memory; past
it the endpoint is cleared (and counted) rather than grow without bound.

`match(hashes)` is the number of leading FleetGate hashes held: the request's cached prefix in blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetgate.router.hashing import root_seed, token_block_hashes
from fleetgate.router.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch

FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass(slots=True)
class ApplyCounts:
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    orphaned: int = 0  # stored blocks whose parent is unknown
    skipped: int = 0  # other group, other block size, unhashable extra keys, malformed token count


class EndpointBlocks:
    def __init__(self, *, group: int | None = None, max_blocks: int = 2_000_000) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be positive")
        self.group = group
        self.max_blocks = max_blocks
        self.block_size: int | None = None
        self.ours_of: dict[BlockHash, int] = {}
        self.media: dict[BlockHash, int] = {}
        self.held: dict[int, int] = {}
        self._medium_bits: dict[str | None, int] = {}
        self.overflows = 0

    def __len__(self) -> int:
        return len(self.held)

    def clear(self) -> None:
        self.ours_of.clear()
        self.media.clear()
        self.held.clear()

    def match(self, hashes: Sequence[int]) -> int:
        held = self.held
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def apply(self, batch: EventBatch, counts: ApplyCounts | None = None) -> ApplyCounts:
        counts = counts or ApplyCounts()
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event, counts)
            elif isinstance(event, BlockRemoved):
                self._remove(event, counts)
            elif isinstance(event, AllBlocksCleared):
                self.clear()
                counts.cleared += 1
        if len(self.ours_of) > self.max_blocks:
            self.clear()
            self.overflows += 1
        return counts

    def _bit(self, medium: str | None) -> int:
        bit = self._medium_bits.get(medium)
        if bit is None:
            bit = self._medium_bits[medium] = 1 << len(self._medium_bits)
        return bit

    def _follows(self, group: int | None, kind: str | None = None) -> bool:
        if group is None:
            return True
        if self.group is None:
            if kind is not None and kind not in FULL_ATTENTION_KINDS:
                return False
            if kind is None and group != 0:
                return False
            self.group = group  # the first full-attention group seen (or 0 from an engine that does not say)
        return group == self.group

    def _store(self, event: BlockStored, counts: ApplyCounts) -> None:
        n = len(event.block_hashes)
        size = event.block_size
        if not self._follows(event.group_idx, event.spec_kind) or len(event.token_ids) != n * size:
            counts.skipped += n
            return
        if self.block_size is None:
            self.block_size = size
        elif size != self.block_size:
            counts.skipped += n
            return
        if event.parent_block_hash is None:
            seed = root_seed(event.lora_name)
        else:
            parent = self.ours_of.get(event.parent_block_hash)
            if parent is None:
                counts.orphaned += n
                return
            seed = parent
        usable = n
        if event.extra_keys is not None:
            for i, extra in enumerate(event.extra_keys[:n]):
                if extra and any(key != event.lora_name for key in extra):
                    usable = i  # this block and its children hash inputs the gateway does not have
                    break
        ours = token_block_hashes(event.token_ids[: usable * size], block_size=size, seed=seed)
        bit = self._bit(event.medium)
        for engine_hash, our_hash in zip(event.block_hashes, ours, strict=False):
            mask = self.media.get(engine_hash, 0)
            if mask & bit:
                continue  # stored again (vLLM's "full" report mode re-announces hits): idempotent
            if mask == 0:
                previous = self.ours_of.get(engine_hash)
                if previous is not None and previous != our_hash:  # cannot happen for one engine; be safe
                    self._release(previous)
                self.ours_of[engine_hash] = our_hash
                self.held[our_hash] = self.held.get(our_hash, 0) + 1
            self.media[engine_hash] = mask | bit
            counts.stored += 1
        counts.skipped += n - usable

    def _remove(self, event: BlockRemoved, counts: ApplyCounts) -> None:
        if event.group_idx is not None and event.group_idx != self.group:  # not (or not yet) the followed group
            counts.skipped += len(event.block_hashes)
            return
        bit = self._bit(event.medium)
        for engine_hash in event.block_hashes:
            mask = self.media.get(engine_hash)
            if mask is None or not mask & bit:
                continue
            mask &= ~bit
            if mask:
                self.media[engine_hash] = mask
                continue
            del self.media[engine_hash]
            our_hash = self.ours_of.pop(engine_hash, None)
            if our_hash is not None:
                self._release(our_hash)
            counts.removed += 1

    def _release(self, our_hash: int) -> None:
        left = self.held.get(our_hash, 0) - 1
        if left > 0:
            self.held[our_hash] = left
        else:
            self.held.pop(our_hash, None)
