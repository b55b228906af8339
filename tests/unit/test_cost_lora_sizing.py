"""The LoRA cost comparison's sizing rule and targets: one rule for both layouts, a replica floor per
deployment, and the saving that shrinks as every fine-tune needs replicas of its own."""

from __future__ import annotations

from fleetgate.bench.cost_lora import default_setup, replicas_for, size_layouts
from fleetgate.bench.cost_lora_report import LoraRow, lora_targets
from fleetgate.bench.workload import generate_lora


def test_every_deployment_keeps_one_replica_and_whole_replicas_cover_the_load() -> None:
    assert replicas_for(0.0, duration_s=100, target_utilisation=0.5) == 1
    assert replicas_for(50.0, duration_s=100, target_utilisation=0.5) == 1
    assert replicas_for(50.1, duration_s=100, target_utilisation=0.5) == 2


def test_the_shared_base_saves_most_at_low_load_and_little_once_each_fine_tune_is_busy() -> None:
    workload = generate_lora(seed=1, requests=400, rate_rps=10.0, fine_tunes=8)
    setup = default_setup(time_scale=1.0, fine_tunes=8)
    savings = []
    for scale in (1, 4, 32):
        per_ft, shared = size_layouts(workload, setup, scale=scale)
        assert len(per_ft) == 8 and min(per_ft.values()) >= 1
        # the shared base carries every fine-tune's work (plus the LoRA overhead): at least the hottest one's share
        assert shared >= max(per_ft.values()) or max(per_ft.values()) == 1
        savings.append(1 - shared / sum(per_ft.values()))
    assert savings[0] > savings[1] > savings[2]
    assert savings[2] < 0.2  # at high load the floors no longer dominate: separate deployments cost about as much


def _row(config: str, usd: float, p50: float, p90: float) -> LoraRow:
    return LoraRow(
        config=config,
        requests=100,
        errors=0,
        gpus=1,
        usd_per_1k=usd,
        ttft_p50_s=p50,
        ttft_p90_s=p90,
        utilisation=0.5,
        disk_loads=0,
        slot_swaps=0,
    )


def test_targets_compare_affinity_with_deployments_and_with_blind() -> None:
    met = lora_targets(
        [
            _row("deployments", 1.0, 0.1, 0.2),
            _row("adapters+affinity", 0.3, 0.14, 0.3),
            _row("adapters+blind", 0.3, 0.2, 0.6),
        ]
    )
    assert [m for _, m, _ in met] == [True, True, True]
    missed = lora_targets(
        [
            _row("deployments", 1.0, 0.1, 0.2),
            _row("adapters+affinity", 0.5, 0.16, 0.7),
            _row("adapters+blind", 0.5, 0.2, 0.6),
        ]
    )
    assert [m for _, m, _ in missed] == [False, False, False]
    assert len(lora_targets([_row("deployments", 1.0, 0.1, 0.2)])) == 0
