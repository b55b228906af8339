"""The segment-wise encode on the real Gemma 3 tokenizer (the project's model, prepared by `fleetgate prepare-model`):
the same ids as the full encode, for rendered chat prompts and completions prompts, on random content."""

from __future__ import annotations

import random

from fleetgate.local.model_prep import prepare_model
from fleetgate.router.prompt_tokens import _encode, load


def test_gemma3_segmented_equals_full_on_random_chat_and_completions_prompts() -> None:
    loaded = load(str(prepare_model()), segment_entries=64, segment_bytes=1 << 24)
    assert loaded.segments is not None and loaded.segments.affixes is not None  # exact for Gemma 3: in use
    backend = loaded.tok.backend_tokenizer
    specials = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "\n", "\n\n", "\n\n\n"]
    atoms = ["policy", " text", "  ", "\t", "\n", "é", "日本語", "😀", "<bos", "end_of_turn>", "<", "User:", "123", ""]
    rng = random.Random(7)
    systems = [" ".join(rng.choice(atoms[:8]) for _ in range(300)) for _ in range(3)]
    for i in range(300):
        user = "".join(rng.choice(atoms + specials) for _ in range(rng.randint(0, 30)))
        system = rng.choice(systems)
        chat = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        completion = {"prompt": f"{system}\nQuestion {i}: {user}"}
        for body in (chat, completion):
            full = _encode(loaded.tok, body)
            assert _encode(loaded.tok, body, loaded.segments) == full, body
        assert list(backend.encode(completion["prompt"]).ids) == _encode(loaded.tok, completion)  # bos added
    assert loaded.segments.cache.hits > 300  # the system prompts came from the cache
