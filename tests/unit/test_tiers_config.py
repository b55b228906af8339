"""Validation of the tier routing configuration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetgate.router.tiers.config import Alias, Cascade, Tier, TierConfig

SMALL = {"name": "small", "model": "m-small", "input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.4}
LARGE = {"name": "large", "model": "m-large", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 4.0}


def test_valid_two_tier_alias_uses_the_calibrated_default_threshold() -> None:
    cfg = TierConfig.model_validate({"aliases": {"auto": {"tiers": [SMALL, LARGE]}}})
    assert cfg.aliases["auto"].cut_points(default=0.42) == [0.42]
    assert cfg.models() == ["m-small", "m-large"]


def test_explicit_threshold_wins_over_the_default() -> None:
    alias = Alias.model_validate({"tiers": [SMALL, LARGE], "threshold": 0.3})
    assert alias.cut_points(default=0.42) == [0.3]


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ({"tiers": []}, "at least 1"),
        ({"tiers": [SMALL, {**LARGE, "name": "small"}]}, "tier names must be unique"),
        ({"tiers": [SMALL, {**LARGE, "model": "m-small"}]}, "different model"),
        ({"tiers": [SMALL, LARGE], "threshold": 1.5}, "less than 1"),
        ({"tiers": [SMALL, LARGE], "threshold": 0.5, "thresholds": [0.5]}, "not both"),
        ({"tiers": [SMALL, LARGE], "thresholds": [0.2, 0.6]}, "need 1 thresholds"),
        ({"tiers": [SMALL, {**LARGE, "name": "mid", "model": "m-mid"}, LARGE]}, "explicit thresholds"),
        (
            {"tiers": [SMALL, {**LARGE, "name": "mid", "model": "m-mid"}, LARGE], "thresholds": [0.6, 0.4]},
            "strictly increasing",
        ),
        ({"tiers": [SMALL, LARGE], "fallback": "sideways"}, "fallback"),
        ({"tiers": [SMALL, LARGE], "cascade": {"refusal_patterns": ["(unclosed"]}}, "not a valid regex"),
        ({"tiers": [SMALL, LARGE], "cascade": {"min_mean_logprob": 0.5}}, "less than or equal to 0"),
        ({"tiers": [SMALL, LARGE], "colour": "blue"}, "Extra inputs"),
    ],
)
def test_invalid_alias_is_rejected_with_a_clear_message(alias: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TierConfig.model_validate({"aliases": {"auto": alias}})


def test_alias_may_not_shadow_a_concrete_model() -> None:
    with pytest.raises(ValidationError, match="differ from concrete model names"):
        TierConfig.model_validate({"aliases": {"m-large": {"tiers": [SMALL, LARGE]}}})


def test_three_tiers_with_increasing_thresholds() -> None:
    mid = {**LARGE, "name": "mid", "model": "m-mid"}
    alias = Alias.model_validate({"tiers": [SMALL, mid, LARGE], "thresholds": [0.3, 0.7]})
    assert alias.cut_points(default=None) == [0.3, 0.7]


def test_price_kinds_and_call_cost() -> None:
    with pytest.raises(ValidationError, match="not both"):
        Tier(name="a", model="b", input_usd_per_mtok=1.0, relative_cost=2.0)
    dollars = Tier(name="a", model="b", input_usd_per_mtok=2.0, output_usd_per_mtok=8.0)
    assert dollars.call_cost(input_tokens=1_000_000, output_tokens=500_000) == pytest.approx(6.0)
    assert Tier(name="a", model="b", relative_cost=3.0).call_cost(input_tokens=5, output_tokens=5) == 3.0
    assert Tier(name="a", model="b").call_cost(input_tokens=5, output_tokens=5) is None


def test_cascade_defaults_are_off() -> None:
    assert Cascade().enabled is False
