"""Characters per token of each model, learned from the prompt token counts the engines report.

Why: the approximate prefix index sizes each engine's capacity in prompt characters (KV tokens x characters per
token) and the prefill-queue scorer estimates a prompt's tokens from its characters. Both need the ratio of the
text the router sees (`RoutingRequest.prompt_text`) to the tokens the engine counts for it, and that ratio depends
on the tokenizer, the language and the chat template: Llama 3.1 on the benchmark's English text gave 6.48 where the
scorers assumed 4 (docs/reports/chars-per-token.md).

The estimate is a ratio of exponentially decayed sums, sum(chars) / sum(tokens), over the requests whose engine
reported its usage, each observation weighing 2^(-age / halfLife) with age counted in requests, so it follows a
change of traffic within a few hundred requests; long prompts weigh more, as they do in the KV cache. Prompts under
`min_tokens` (mostly template) are skipped. Until `min_samples` requests were seen the caller's fallback stands.
One instance per scheduler (in its `FleetState`), one estimate per model name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Sums:
    chars: float = 0.0
    tokens: float = 0.0
    samples: int = 0


class CharsPerToken:
    def __init__(self, *, half_life: float = 200.0, min_samples: int = 20, min_tokens: int = 16,
                 low: float = 1.0, high: float = 16.0) -> None:
        if half_life <= 0 or min_samples < 1 or min_tokens < 1 or not 0 < low <= high:
            raise ValueError("half_life, min_samples and min_tokens must be positive and 0 < low <= high")
        self._decay = 0.5 ** (1.0 / half_life)
        self.min_samples = min_samples
        self.min_tokens = min_tokens
        self.low = low
        self.high = high
        self._sums: dict[str, _Sums] = {}
        self._value: dict[str, float] = {}  # model -> learned ratio, only once min_samples were seen (read per pick)

    def observe(self, model: str, chars: float, tokens: int) -> None:
        """One request's prompt: `chars` characters routed, `tokens` prompt tokens the engine counted."""
        if tokens < self.min_tokens or chars <= 0:
            return
        s = self._sums.get(model)
        if s is None:
            s = self._sums[model] = _Sums()
        # Each observation is clamped to [low, high] x its tokens before it is summed: the sums weigh long prompts
        # more, so one hostile prompt (a megabyte of whitespace the tokenizer folds into a few tokens) would
        # otherwise carry the whole model's ratio to the clamp for hundreds of requests.
        chars = min(max(chars, self.low * tokens), self.high * tokens)
        s.chars = s.chars * self._decay + chars
        s.tokens = s.tokens * self._decay + tokens
        s.samples += 1
        if s.samples >= self.min_samples:
            self._value[model] = min(self.high, max(self.low, s.chars / s.tokens))

    def get(self, model: str, fallback: float) -> float:
        """The learned characters per token of `model`, or `fallback` until enough requests were seen."""
        return self._value.get(model, fallback)

    def learned(self) -> dict[str, float]:
        """Model -> learned ratio, for the models past `min_samples` (the metric)."""
        return dict(self._value)

    def samples(self, model: str) -> int:
        s = self._sums.get(model)
        return 0 if s is None else s.samples


FALLBACK = 4  # characters per token until a model's ratio is learned: English under common BPE tokenizers


def chars_per_token_param(value: object, kind: type[int] | type[float]) -> int | float | None:
    """A scorer's `charsPerToken` parameter: `auto` -> None (learn it); a positive number -> that number, fixed."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"parameter 'charsPerToken' must be auto or a positive number, got {value!r}")
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"parameter 'charsPerToken' must be auto or a positive number, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"parameter 'charsPerToken' must be auto or a positive number, got {value!r}")
    return number
