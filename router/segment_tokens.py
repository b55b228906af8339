"""A prompt's token ids from per-segment encodes, the repeated long segments from a bounded cache.

Why: with `tokenizer: local` the gateway encodes every prompt in full on its event loop (5.5 ms of CPU, GIL held,
for a 2,700-token prompt on the GPU host), although on shared-prefix traffic most of each prompt is a system
message it has encoded many times before.

The property used: a Hugging Face `tokenizers` encode first splits the text on the added tokens (every entry of
`added_tokens`, special or not: `<bos>`, `<|eot_id|>`, Gemma's `\\n` runs; matched leftmost-longest, with their
`lstrip`/`rstrip`/`single_word`/`normalized` rules, unless `encode_special_tokens` is set), then normalizes,
pre-tokenizes and runs the model on each piece between them separately. So the ids of a text are the
concatenation of the ids of its pieces and of the added tokens between them, and any span that starts and ends
at such a boundary can be encoded on its own. vLLM's chat path renders the template to text and tokenizes it
with added tokens parsed and `add_special_tokens=False` (its completions path with `add_special_tokens=True`),
so special-token text inside a user's message is parsed the same way here as there.

Algorithm, per text:
1. Find the boundaries with the library's own splitter: a copy of the tokenizer whose model is a one-entry
   `WordLevel` (each piece that is not an added token becomes one id), with no normalizer, pre-tokenizer or
   post-processor, run through `encode_batch_fast` (no offsets: the char offsets of `encode` cost ~30 us per
   KiB); the added tokens' places are found again with `str.find`, exact because tokenizers whose added tokens
   strip whitespace, must be single words, or are matched after normalization get no encoder. One linear scan
   in Rust, no BPE: ~40 us for a 17 KiB prompt here.
2. Chunks, greedily from the start: cut at the first boundary (either edge of an added token) at least
   `min_chars` (512) characters after the previous cut. Two prompts that share a prefix get the same chunks over
   it, however many newlines (Gemma's `\n` is an added token) it holds. Each chunk is looked up by a seeded
   128-bit hash of its text; a miss is encoded (and offered to the cache), the short tail is encoded as is.
   A chunk enters the cache at once while the cache has room, and once it is full only the second time it is seen
   (a unique user message passes once and never displaces the shared system prompts); the cache is an LRU
   bounded in entries and in estimated bytes (`BYTES_PER_ID` per cached id). What the cache cannot help: a shared
   part with no added token between it and the unique part (a completions prompt to a Llama-3 tokenizer, which has
   no `\n` token) is one piece, encoded whole.
3. `add_special_tokens=True` adds the post-processor's fixed prefix and suffix (e.g. `<bos>`), measured at build.
4. Steps 1-3 are split so that the encode can leave the event loop: `plan` (on the loop: the boundaries, the
   cached chunks' ids, the texts still to encode, each distinct one once), `encode_texts` (one `encode_batch_fast`
   call over those texts; it touches only the tokenizer and releases the GIL, so a caller may run it in a worker
   thread), `Plan.assemble` (on the loop: the ids in order, the encoded chunks offered to the cache).

Safety: `build_segmented_encoder` compares this encode with the full encode on probe strings (the tokenizer's
added tokens between texts with whitespace and unicode at the edges, empty pieces, the model's rendered chat
template), cutting at every boundary and at `min_chars`, and returns None, with the
reason logged once, when any differs, e.g. a Metaspace pre-tokenizer with `prepend_scheme: first` (only the
text's first piece gets `▁`), or a tokenizer with truncation or padding set. The caller then encodes in full.
If the post-processor's additions are not a fixed prefix/suffix, only `add_special_tokens=True` encodes in full.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

log = logging.getLogger(__name__)
SEGMENT = "<fleetgate-segment>"  # the splitter's only vocabulary entry (its unk token): a piece between added tokens
SEGMENT_ID = 2**31 - 1
BYTES_PER_ID = 36  # a cached id: a tuple slot (8) and an int object (28), the dominant cost of an entry
PROBE_TEXTS = ("", " ", "  ", "\n", "hello world", " leading", "trailing ", "  two  spaces  ", "tab\there",
               "line\nbreak\n\n", "Ünïcödé 日本語 😀 ok", "'s 're 123456 x", "▁meta ▁space")


class SegmentCache:
    """LRU of segment hash -> token ids, bounded in entries and bytes, admitting a segment at once while it has room,
    then on its second sighting."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries <= 0 or max_bytes <= 0:
            raise ValueError("the segment cache needs positive entry and byte bounds")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()  # keys seen once, not (yet) cached

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()
        self._seen.clear()
        self.bytes = self.hits = self.misses = 0

    def get(self, key: int) -> tuple[int, ...] | None:
        ids = self._data.get(key)
        if ids is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return ids

    def offer(self, key: int, ids: Sequence[int]) -> None:
        """Cache `ids` while the cache has room, or once full if `key` was offered before (and fits); otherwise
        remember that it was seen. Room first: a fresh gateway (a new replica, each point of a benchmark) would
        otherwise encode every shared prompt in full twice before reading it from here (issue 24); a unique message
        only takes a place nobody else wanted, and once the cache is full the second-sighting rule protects it."""
        cost = BYTES_PER_ID * len(ids)
        if cost > self.max_bytes:
            return  # larger than the whole cache: it would only evict everything else
        room = len(self._data) < self.max_entries and self.bytes + cost <= self.max_bytes
        if not room and key not in self._seen:
            self._seen[key] = None
            if len(self._seen) > 4 * self.max_entries:
                self._seen.popitem(last=False)
            return
        self._seen.pop(key, None)
        if key in self._data:
            return
        self._data[key] = tuple(ids)
        self.bytes += cost
        while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
            _, old = self._data.popitem(last=False)
            self.bytes -= BYTES_PER_ID * len(old)


@dataclass(frozen=True, slots=True)
class Affixes:
    """What the post-processor adds around one sequence's ids with `add_special_tokens=True`."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]


class SegmentedEncoder:
    """`encode(text)` equal to `backend.encode(text).ids`, with long repeated pieces from `cache`."""

    def __init__(self, *, backend: Any, splitter: Any, added: Mapping[int, str], segment_id: int,
                 cache: SegmentCache, min_chars: int, affixes: Affixes | None) -> None:
        self.backend = backend
        self.splitter = splitter
        self.added = added  # the splitter's id -> the added token's text
        self.segment_id = segment_id
        self.cache = cache
        self.min_chars = min_chars
        self.affixes = affixes
        self._seed = secrets.randbits(64)  # keys a tenant cannot aim a collision at

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int] | None:
        """The ids; None when `add_special_tokens` asks for additions this encoder cannot reproduce."""
        plan = self.plan(text, add_special_tokens=add_special_tokens)
        return None if plan is None else plan.assemble(encode_texts(self.backend, plan.texts, plan.special))

    def plan(self, text: str, *, add_special_tokens: bool) -> Plan | None:
        """What `encode` needs: the cached chunks' ids, and the texts still to encode (`Plan.texts`, in one
        `encode_texts` call, which needs no lock: a caller may run it in a thread while this loop goes on).
        None when `add_special_tokens` asks for additions this encoder cannot reproduce."""
        if add_special_tokens and self.affixes is None:
            return None
        prefix, suffix = (self.affixes.prefix, self.affixes.suffix) if add_special_tokens and self.affixes else ((), ())
        plan = Plan(cache=self.cache)
        if prefix:
            plan.parts.append(prefix)
        start = 0  # the current chunk's start: text before it is in `plan`
        scan = 0  # where the splitter's next token starts
        # `encode_batch_fast`: no offsets (the char offsets of `encode` cost ~30 us per KiB); the added tokens' places
        # are found again with `str.find` instead, exact since they have no lstrip/rstrip/single_word (`_splitter`)
        for token in self.splitter.encode_batch_fast([text], add_special_tokens=False)[0].ids:
            if token == self.segment_id:
                continue  # a piece: it runs from `scan` to the next added token (or the end)
            content = self.added[token]
            at = text.find(content, scan)
            if at < 0:
                return Plan.whole(text, add_special_tokens)  # cannot happen; never guess
            if at - start >= self.min_chars:  # both edges of an added token are boundaries
                self._chunk(plan, text[start:at])
                start = at
            scan = at + len(content)
            if scan - start >= self.min_chars:
                self._chunk(plan, text[start:scan])
                start = scan
        if len(text) - start >= self.min_chars:
            self._chunk(plan, text[start:])
        elif start < len(text):
            plan.add(text[start:], None)
        if suffix:
            plan.parts.append(suffix)
        return plan

    def _chunk(self, plan: Plan, chunk: str) -> None:
        """Add the ids of `chunk` (text between two boundaries) to `plan`, from the cache when it was seen before."""
        key = xxhash.xxh3_128_intdigest(chunk.encode("utf-8", "surrogatepass"), self._seed)
        ids = self.cache.get(key)
        if ids is None:
            plan.add(chunk, key)
        else:
            plan.parts.append(ids)


@dataclass(slots=True)
class Plan:
    """A text's ids before the encode: known ids (cached chunks, affixes) in order, and, in their places, the
    indices of the texts still to encode. `special`: those texts are encoded with `add_special_tokens` (only a
    whole-text plan, `Plan.whole`); `keys[i]`: the cache key under which `texts[i]`'s ids are offered (None: not)."""

    cache: SegmentCache | None = None
    parts: list[Sequence[int] | int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    keys: list[int | None] = field(default_factory=list)
    special: bool = False
    _index: dict[int, int] = field(default_factory=dict)  # cache key -> its text's index

    @classmethod
    def whole(cls, text: str, add_special_tokens: bool) -> Plan:
        """The plan of a full encode: one text, nothing cached."""
        return cls(parts=[0], texts=[text], keys=[None], special=add_special_tokens)

    @property
    def chars(self) -> int:
        """Characters still to encode: what the encode will cost."""
        return sum(map(len, self.texts))

    def add(self, text: str, key: int | None) -> None:
        if key is not None:
            if (seen := self._index.get(key)) is not None:  # the same chunk twice in one text: encoded once
                self.parts.append(seen)
                return
            self._index[key] = len(self.texts)
        self.parts.append(len(self.texts))
        self.texts.append(text)
        self.keys.append(key)

    def assemble(self, encoded: Sequence[Sequence[int]]) -> list[int]:
        """The text's ids, given the ids of `texts` (`encode_texts`); offers the encoded chunks to the cache."""
        if len(encoded) != len(self.texts):
            raise ValueError(f"{len(encoded)} encodings for {len(self.texts)} texts")
        if self.cache is not None:
            for key, ids in zip(self.keys, encoded, strict=True):
                if key is not None:
                    self.cache.offer(key, ids)
        out: list[int] = []
        for part in self.parts:
            out += encoded[part] if isinstance(part, int) else part
        return out


def encode_texts(backend: Any, texts: Sequence[str], special: bool = False) -> list[list[int]]:
    """Each text's ids, in one `encode_batch_fast` call: the library releases the GIL while it encodes (unlike
    `encode`), so in a worker thread this leaves the event loop running. Touches only `backend`."""
    if not texts:
        return []
    return [list(e.ids) for e in backend.encode_batch_fast(list(texts), add_special_tokens=special)]


def build_segmented_encoder(backend: Any, *, max_entries: int, max_bytes: int, min_chars: int = 512,
                            probes: Iterable[str] = ()) -> SegmentedEncoder | None:
    """An encoder for `backend` (a `tokenizers.Tokenizer`), or None (reason logged) when its encode would differ."""
    encoder, reason = None, None
    try:
        splitter, segment_id, reason = _splitter(backend)
    except Exception as exc:  # a tokenizer the library serialises in a way this copy cannot read back
        splitter, segment_id, reason = None, 0, f"no splitter: {exc}"
    affixes = _affixes(backend) if splitter is not None else None
    if splitter is not None:
        added = {i: t.content for i, t in splitter.get_added_tokens_decoder().items()}
        encoder = SegmentedEncoder(backend=backend, splitter=splitter, added=added, segment_id=segment_id,
                                   min_chars=min_chars, affixes=affixes,
                                   cache=SegmentCache(max_entries=max_entries, max_bytes=max_bytes))
        reason = _mismatch(encoder, backend, [*probe_strings(backend), *probes])
    if reason is not None:
        log.warning("tokenizing whole prompts: a segment-wise encode would differ for this tokenizer",
                    extra={"reason": reason})
        return None
    if affixes is None:
        log.warning("prompts with add_special_tokens=true are tokenized whole: the post-processor's additions "
                    "are not a fixed prefix and suffix")
    return encoder


def _splitter(backend: Any) -> tuple[Any, int, str | None]:
    """A copy of `backend` that only splits on its added tokens: each piece between them is one `segment_id`."""
    from tokenizers import Tokenizer

    if not hasattr(backend, "encode_batch_fast"):
        return None, 0, "tokenizers is older than 0.21 (no encode_batch_fast)"
    spec = json.loads(backend.to_str())
    if spec.get("truncation") is not None or spec.get("padding") is not None:
        return None, 0, "truncation or padding is set: the full encode would cut or pad the whole prompt"
    added = spec.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") or a.get("single_word") for a in added):
        return None, 0, "an added token strips whitespace or must be a single word: its matches vary in length"
    if spec.get("normalizer") is not None and any(a.get("normalized") for a in added):
        return None, 0, "an added token is matched after normalization"
    segment_id = SEGMENT_ID  # the copy renumbers its added tokens from its vocabulary's size (1): never this high
    spec.update(normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None,
                model={"type": "WordLevel", "vocab": {SEGMENT: segment_id}, "unk_token": SEGMENT})
    splitter = Tokenizer.from_str(json.dumps(spec))
    splitter.encode_special_tokens = backend.encode_special_tokens
    contents = {i: t.content for i, t in splitter.get_added_tokens_decoder().items()}
    if segment_id in contents or splitter.token_to_id(SEGMENT) != segment_id:
        return None, 0, f"the splitter's {SEGMENT} collides with an added token"
    return splitter, segment_id, None


def _affixes(backend: Any) -> Affixes | None:
    """The fixed ids the post-processor puts before and after a sequence, if they are fixed."""
    found: set[Affixes] = set()
    for text in ("a", "hello world", "1 + 2"):  # not "": its empty ids would fit anywhere
        plain = list(backend.encode(text, add_special_tokens=False).ids)
        full = list(backend.encode(text, add_special_tokens=True).ids)
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), None)
        if at is None:
            return None
        found.add(Affixes(prefix=tuple(full[:at]), suffix=tuple(full[at + len(plain):])))
    return found.pop() if len(found) == 1 else None


def probe_strings(backend: Any, *, per_kind: int = 6) -> list[str]:
    """Texts around the tokenizer's own added tokens (a few special, a few not), and without any."""
    decoder = backend.get_added_tokens_decoder()
    special = [t.content for _, t in sorted(decoder.items()) if t.special][:per_kind]
    plain = [t.content for _, t in sorted(decoder.items()) if not t.special][:per_kind]
    out = list(PROBE_TEXTS)
    for i, token in enumerate(special + plain):
        a, b = PROBE_TEXTS[i % len(PROBE_TEXTS)], PROBE_TEXTS[(3 * i + 4) % len(PROBE_TEXTS)]
        out += [token, f"{a}{token}{b}", f"{b}{token}{token}{a}", f" {token} x{token}\n", f"x{a}{token}{b}x"]
    long = "The shared policy text, repeated to be a cached piece. " * 8
    out += [f"{t}{long}{t}user text {t}" for t in (special + plain)[:4]] + [long, f" {long} "]
    return out


def _mismatch(encoder: SegmentedEncoder, backend: Any, probes: Sequence[str]) -> str | None:
    configured = encoder.min_chars
    try:
        for encoder.min_chars in (1, configured):  # 1: a cut at every boundary, the premise tested at each
            for text in probes:
                for special in (False, True):
                    for _ in range(3):  # encoded (cached while there is room, else seen), then from the cache
                        ours = encoder.encode(text, add_special_tokens=special)
                        if ours is None:
                            break
                        theirs = list(backend.encode(text, add_special_tokens=special).ids)
                        if ours != theirs:
                            return f"probe {text[:60]!r} (add_special_tokens={special}): {ours[:8]} != {theirs[:8]}"
    finally:
        encoder.min_chars = configured
        encoder.cache.clear()  # the probes are no one's prompts
    return None
