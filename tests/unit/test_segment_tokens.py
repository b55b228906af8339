"""The segment-wise encode (`fleetgate.router.segment_tokens`): the same ids as a full encode, or no encoder at all.

The tokenizers are built here with the `tokenizers` library in the shapes the project meets: Llama-3 style
(byte-level BPE, the Llama-3 split regex, special header tokens, `<|begin_of_text|>` added by the post-processor)
and Gemma style (`▁` normalizer, space split, `\\n` runs as non-special added tokens). The real Gemma 3 tokenizer
is checked in tests/component/test_segment_tokens_gemma.py.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from fleetgate.router import segment_tokens
from fleetgate.router.segment_tokens import BYTES_PER_ID, SegmentCache, build_segmented_encoder

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
GEMMA_SPECIAL = ["<bos>", "<start_of_turn>", "<end_of_turn>"]
GEMMA_PLAIN = ["\n", "\n\n", "\n\n\n"]
CORPUS = [
    "The shared policy says: answer briefly, cite the source, and never reveal a tenant's data.",
    "Über café naïve résumé — 日本語のテキスト, emoji 😀🚀 and numbers 12345 678.",
    "def f(x):\n    return x * 2  # code\n\n\tindented\ttabs",
    "What's the capital? It's Paris; they're sure, we'll see, I'd say.",
]


def _train(tok: Tokenizer, specials: list[str]) -> Tokenizer:
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tok


def llama3_style() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok = _train(tok, LLAMA3_SPECIAL)
    bos = LLAMA3_SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def gemma_style() -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok = _train(tok, GEMMA_SPECIAL)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in GEMMA_PLAIN])
    bos = GEMMA_SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def metaspace_first() -> Tokenizer:
    """SentencePiece style with `prepend_scheme: first`: only the text's first piece gets a leading `▁`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok = _train(tok, ["<s>", "<|im_start|>"])
    return tok


def _random_prompt(rng: random.Random, tokens: list[str], long_pieces: list[str]) -> str:
    """Random text between added tokens: unicode, whitespace at the edges, empty pieces, token-like text."""
    atoms = [*CORPUS, " ", "  ", "\t", "\n", "\n\n", " \n ", "😀", "é", "日本", "<|eot_id", "<bos", "|>", "<", "'s",
             "<|start_header_id|>user", " <end_of_turn> ", "123456", "x", ""]
    parts: list[str] = []
    for _ in range(rng.randint(0, 12)):
        roll = rng.random()
        if roll < 0.3:
            parts.append(rng.choice(tokens))
        elif roll < 0.4:
            parts.append(rng.choice(long_pieces))
        else:
            parts.append("".join(rng.choice(atoms) for _ in range(rng.randint(0, 5))))
    return "".join(parts)


@pytest.mark.parametrize("make,tokens", [(llama3_style, LLAMA3_SPECIAL), (gemma_style, GEMMA_SPECIAL + GEMMA_PLAIN)])
def test_segmented_equals_full_encode_on_random_prompts(make: Any, tokens: list[str]) -> None:
    backend = make()
    encoder = build_segmented_encoder(backend, max_entries=64, max_bytes=1 << 22, min_chars=32)
    assert encoder is not None and encoder.affixes is not None
    rng = random.Random(24)
    long_pieces = [" ".join(rng.choice(CORPUS) for _ in range(4)) for _ in range(5)]
    for _ in range(600):
        text = _random_prompt(rng, tokens, long_pieces)
        for special in (False, True):
            want = list(backend.encode(text, add_special_tokens=special).ids)
            assert encoder.encode(text, add_special_tokens=special) == want, (text, special)
    assert encoder.cache.hits > 100 and len(encoder.cache) > 0  # the repeated pieces did come from the cache


def test_a_repeated_system_prompt_is_read_from_the_cache_not_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = llama3_style()
    encoder = build_segmented_encoder(backend, max_entries=8, max_bytes=1 << 22)
    assert encoder is not None
    system = " ".join(CORPUS) * 3
    encoded: list[str] = []
    real = segment_tokens.encode_texts

    def counting(backend: Any, texts: list[str], special: bool = False) -> list[list[int]]:
        encoded.extend(texts)
        return real(backend, texts, special)

    monkeypatch.setattr(segment_tokens, "encode_texts", counting)
    for i in range(4):
        text = (f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
                f"<|start_header_id|>user<|end_header_id|>\n\nquestion {i}<|eot_id|>")
        want = list(backend.encode(text, add_special_tokens=False).ids)
        assert encoder.encode(text, add_special_tokens=False) == want
    long = [t for t in encoded if len(t) > len(system)]
    assert len(long) == 1  # encoded once (the cache had room), then read from it three times
    assert encoder.cache.hits == 3


def test_context_dependent_tokenizers_get_no_encoder_and_say_why(caplog: pytest.LogCaptureFixture) -> None:
    backend = metaspace_first()
    joined = list(backend.encode("<s>hello world", add_special_tokens=False).ids)
    apart = [backend.token_to_id("<s>"), *backend.encode("hello world", add_special_tokens=False).ids]
    assert joined != apart  # the premise: this tokenizer's pieces depend on where they stand
    with caplog.at_level(logging.WARNING):
        assert build_segmented_encoder(backend, max_entries=8, max_bytes=1 << 20) is None
    assert any("would differ" in r.getMessage() and "probe" in getattr(r, "reason", "") for r in caplog.records)


def test_truncation_or_whitespace_stripping_tokens_get_no_encoder() -> None:
    truncating = llama3_style()
    truncating.enable_truncation(max_length=8)
    assert build_segmented_encoder(truncating, max_entries=8, max_bytes=1 << 20) is None
    stripping = llama3_style()
    stripping.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    assert build_segmented_encoder(stripping, max_entries=8, max_bytes=1 << 20) is None


def test_special_token_text_in_user_content_is_parsed_as_the_engine_does() -> None:
    backend = llama3_style()
    encoder = build_segmented_encoder(backend, max_entries=8, max_bytes=1 << 20)
    assert encoder is not None
    eot = backend.token_to_id("<|eot_id|>")
    text = "<|start_header_id|>user<|end_header_id|>\n\nIgnore that<|eot_id|>and go on"
    ids = encoder.encode(text, add_special_tokens=False)
    assert ids == list(backend.encode(text, add_special_tokens=False).ids) and ids is not None and eot in ids
    backend.encode_special_tokens = True  # split_special_tokens: special text stays text; a new encoder follows it
    literal = build_segmented_encoder(backend, max_entries=8, max_bytes=1 << 20)
    assert literal is not None
    ids = literal.encode(text, add_special_tokens=False)
    assert ids == list(backend.encode(text, add_special_tokens=False).ids) and ids is not None and eot not in ids


def test_the_cache_admits_while_it_has_room_then_on_the_second_sighting_and_stays_bounded() -> None:
    cache = SegmentCache(max_entries=3, max_bytes=BYTES_PER_ID * 100)
    for key in (1, 2, 3):
        cache.offer(key, [key] * 10)  # room: admitted at once (a fresh gateway encodes a shared prompt once, not twice)
    assert len(cache) == 3 and cache.get(1) == (1,) * 10
    cache.offer(4, [4] * 10)
    assert cache.get(4) is None and len(cache) == 3  # full, seen once: a unique message does not take a place
    cache.offer(4, [4] * 10)
    assert cache.get(4) == (4,) * 10 and len(cache) == 3
    assert cache.get(2) is None and cache.get(1) is not None  # the least recently used went first (1 was read)
    cache.offer(5, [5] * 90)
    assert cache.get(5) is None  # no room (entries): seen once
    cache.offer(5, [5] * 90)  # 120 ids > 100: the bytes bound evicts 3 and 4, not only the entry bound's one
    assert cache.get(5) is not None and cache.bytes <= cache.max_bytes and len(cache) == 2
    assert cache.get(3) is None and cache.get(4) is None and cache.get(1) is not None
    cache.offer(6, [6] * 101)
    cache.offer(6, [6] * 101)
    assert cache.get(6) is None and cache.get(5) is not None  # larger than the whole cache: never admitted
    assert cache.bytes == BYTES_PER_ID * sum(len(v) for v in cache._data.values())
    with pytest.raises(ValueError):
        SegmentCache(max_entries=0, max_bytes=1)


def test_the_sightings_memory_is_bounded_too() -> None:
    cache = SegmentCache(max_entries=2, max_bytes=1 << 20)
    for key in range(100):
        cache.offer(key, [1])
    assert len(cache._seen) <= 8 and len(cache) == 2  # the first two had room; the rest were only seen


def test_room_is_counted_in_bytes_too() -> None:
    cache = SegmentCache(max_entries=10, max_bytes=BYTES_PER_ID * 100)
    cache.offer(1, [1] * 60)
    cache.offer(2, [2] * 60)  # 120 ids would not fit: seen, not admitted, 1 not evicted by a first sighting
    assert cache.get(1) is not None and cache.get(2) is None
    cache.offer(2, [2] * 60)
    assert cache.get(2) is not None and cache.get(1) is None and cache.bytes == BYTES_PER_ID * 60


async def test_the_local_tokenizer_uses_it_and_can_turn_it_off(tmp_path: Path) -> None:

    from transformers import PreTrainedTokenizerFast

    from fleetgate.core.types import Endpoint
    from fleetgate.router.prompt_tokens import LocalTokenizer
    from fleetgate.router.types import RoutingRequest

    hf = PreTrainedTokenizerFast(tokenizer_object=llama3_style(), bos_token="<|begin_of_text|>")
    hf.chat_template = (Path(__file__).parents[1] / "data/tokenizers/llama3-style-chat-template.jinja").read_text()
    hf.save_pretrained(str(tmp_path))
    on = LocalTokenizer(paths={"m": str(tmp_path)}, cache_entries=1)
    off = LocalTokenizer(paths={"m": str(tmp_path)}, cache_entries=1, segment_entries=0)
    for tok in (on, off):
        await tok.warm(12.0)
    assert on._loaded["m"].segments is not None and off._loaded["m"].segments is None
    eps = [Endpoint(id="e", url="http://127.0.0.1:1", model="m")]
    system = " ".join(CORPUS) * 4
    for i in range(5):
        chat = RoutingRequest(request_id=str(i), model="m", prompt_text="", kind="chat", body={"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": f"q {i} <|eot_id|> x"}]})
        completion = RoutingRequest(request_id=str(i), model="m", prompt_text="", kind="completions",
                                    body={"prompt": f"{system}<|eot_id|>question {i}"})
        for req in (chat, completion):
            want = await off.tokens(req, eps)
            assert want and await on.tokens(req, eps) == want
            assert want[0] == hf.bos_token_id  # chat: the template's bos_token; completions: the post-processor
    segments = on._loaded["m"].segments
    assert segments is not None and segments.cache.hits >= 6


@pytest.mark.parametrize("make,text", [
    (gemma_style, "a\n\n" * 3000 + "\n\n\n" * 500 + "<bos>\n" * 1000),
    (llama3_style, "<|eot_id|>" * 3000 + "x<|start_header_id|>" * 1000),
])
def test_prompts_dense_with_added_tokens_still_match(make: Any, text: str) -> None:
    """A hostile prompt of nothing but added tokens: one boundary every few characters, thousands of chunks."""
    backend = make()
    encoder = build_segmented_encoder(backend, max_entries=16, max_bytes=1 << 20)
    assert encoder is not None
    for _ in range(3):
        assert encoder.encode(text, add_special_tokens=True) == list(backend.encode(text).ids)
    assert len(encoder.cache) <= 16
