"""`fleetgate sim`'s LoRA flags become the engine profile as vLLM reads them (and are refused as vLLM refuses them)."""

from __future__ import annotations

import argparse

import pytest

from fleetgate.sim.serve import add_arguments, lora_changes


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_map_to_the_profile_and_the_env_var_opens_the_runtime_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    args = _args("--enable-lora", "--max-loras", "3", "--max-lora-rank", "32", "--lora-modules", "a=/x/a", "b=/x/b")
    changes = lora_changes(args)
    assert changes["max_loras"] == 3 and changes["max_lora_rank"] == 32
    assert changes["lora_modules"] == (("a", "/x/a"), ("b", "/x/b"))
    assert changes["allow_runtime_lora_updating"] is False
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    assert lora_changes(args)["allow_runtime_lora_updating"] is True


@pytest.mark.parametrize(
    "argv",
    [
        ("--enable-lora", "--max-loras", "0"),
        ("--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"),
        ("--enable-lora", "--lora-modules", "no-path"),
    ],
)
def test_bad_flags_stop_the_start(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        lora_changes(_args(*argv))
