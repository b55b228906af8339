"""`fleetgate up` with LoRA adapters: config validation, the vLLM command line and environment, the
gateway routes, and resolving adapter directories (no training, no engine: the e2e test does those)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.local.adapter_prep import PACKAGED_ADAPTERS, adapter_dir, expected_identity
from fleetgate.local.config import EngineConfig, UpConfig, load_up_config
from fleetgate.local.errors import LocalStackError, ModelPrepError
from fleetgate.local.up import add_arguments, apply_overrides, resolve_adapters, route_models
from fleetgate.local.vllm_command import engine_env, lora_argv, vllm_specs

URLS = ["http://127.0.0.1:8100"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _config(tmp_path: Path, text: str) -> UpConfig:
    path = tmp_path / "up.yaml"
    path.write_text(text)
    return load_up_config(path)


def _peft_dir(path: Path, *, rank: int) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return path


def test_adapters_by_name_or_by_path(tmp_path: Path) -> None:
    config = _config(tmp_path, "engine:\n  adapters:\n  - pirate\n  - {name: mine, path: /opt/lora/mine}\n")
    assert [(a.name, a.path) for a in config.engine.adapters] == [("pirate", None), ("mine", Path("/opt/lora/mine"))]
    assert config.engine.lora_slots() == 2
    assert EngineConfig(adapters=["pirate"], max_loras=4).lora_slots() == 4  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("yaml", "match"),
    [
        ("engine:\n  adapters: [pirate, pirate]\n", "unique"),
        ("engine:\n  adapters: [unknown-one]\n", "not a packaged one"),
        ("engine:\n  adapters: [{name: Bad Name, path: /x}]\n", "lowercase"),
        ("engine:\n  adapters: [{name: gemma-3-270m, path: /x}]\n", "base model"),
        ("engine:\n  max_loras: 2\n", "lists none"),
        ("engine:\n  model_path: /models/other\n  adapters: [pirate]\n", "trained for the packaged model"),
        ("engine:\n  adapters: [pirate]\n  max_lora_rank: 12\n", "max_lora_rank"),
        ("engine:\n  adapters: [pirate]\n  max_loras: 0\n", "max_loras"),
        ("engine:\n  adapters: [{name: x, path: /x, rank: 8}]\n", "rank"),
    ],
)
def test_bad_adapter_config_is_named(tmp_path: Path, yaml: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _config(tmp_path, yaml)


def test_adapters_flag_serves_the_packaged_adapters_unless_the_file_lists_some(tmp_path: Path) -> None:
    config = apply_overrides(UpConfig(), _args("--adapters"))
    assert [a.name for a in config.engine.adapters] == list(PACKAGED_ADAPTERS)
    listed = apply_overrides(_config(tmp_path, "engine:\n  adapters: [signoff]\n"), _args("--adapters"))
    assert [a.name for a in listed.engine.adapters] == ["signoff"]
    assert apply_overrides(UpConfig(), _args()).engine.adapters == []


def test_vllm_command_enables_lora_with_the_adapters(tmp_path: Path) -> None:
    config = EngineConfig(adapters=["pirate", "signoff"], max_lora_rank=8)  # type: ignore[list-item]
    dirs = {"signoff": tmp_path / "s", "pirate": tmp_path / "p"}
    (spec,) = vllm_specs(config=config, model_path=tmp_path / "model", adapters=dirs, python="py")
    argv = list(spec.argv)
    tail = argv[argv.index("--enable-lora") :]
    assert tail == [
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "8",
        "--lora-modules",
        f"pirate={tmp_path / 'p'}",
        f"signoff={tmp_path / 's'}",
    ]  # config order
    assert argv.index("--served-model-name") < argv.index("--enable-lora")
    assert spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert spec.expect_model == "gemma-3-270m"


def test_no_adapters_no_lora_flags_and_no_runtime_updates(tmp_path: Path) -> None:
    (spec,) = vllm_specs(config=EngineConfig(), model_path=tmp_path, python="py")
    assert not [a for a in spec.argv if a.startswith("--") and "lora" in a]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in engine_env(config=EngineConfig(), base={})
    assert lora_argv(config=EngineConfig(), adapters={}) == []


def test_engine_env_from_the_file_still_wins(tmp_path: Path) -> None:
    config = EngineConfig(adapters=["pirate"], env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "False"})  # type: ignore[list-item]
    assert engine_env(config=config, base={})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "False"


def test_an_adapter_without_a_directory_is_refused(tmp_path: Path) -> None:
    config = EngineConfig(adapters=["pirate", "signoff"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="signoff"):
        vllm_specs(config=config, model_path=tmp_path, adapters={"pirate": tmp_path})


def test_adapters_are_listed_under_the_base_route(tmp_path: Path) -> None:
    dirs = {"pirate": _peft_dir(tmp_path / "p", rank=8), "signoff": tmp_path / "missing"}
    settings = route_models(
        gateway=UpConfig().gateway,
        model="gemma-3-270m",
        served_name="gemma-3-270m",
        urls=URLS,
        max_model_len=512,
        adapters=dirs,
    )
    (base,) = settings.models
    assert (base.name, base.endpoints, base.max_model_len) == ("gemma-3-270m", URLS, 512)
    assert [(a.name, a.source, a.rank) for a in base.adapters] == [
        ("pirate", str(tmp_path / "p"), 8),
        ("signoff", str(tmp_path / "missing"), None),  # rank unknown: the gateway does without
    ]
    GatewaySettings.model_validate(settings.model_dump())  # a valid gateway config (names unique)


def test_adapters_the_file_lists_keep_their_entry_and_names_may_not_clash(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "gateway:\n  models:\n  - name: gemma-3-270m\n    adapters: [{name: pirate, source: /a, tenants: [acme]}]\n"
        "  - name: other\n",
    )
    dirs = {"pirate": tmp_path / "p", "signoff": tmp_path / "s"}
    settings = route_models(gateway=config.gateway, model="gemma-3-270m", served_name="gemma-3-270m", urls=URLS,
                            adapters=dirs)  # fmt: skip
    routes = {r.name: r for r in settings.models}
    assert [(a.name, a.source, a.tenants) for a in routes["gemma-3-270m"].adapters] == [
        ("pirate", "/a", ["acme"]),
        ("signoff", str(tmp_path / "s"), []),
    ]
    assert routes["other"].adapters == []
    with pytest.raises(ConfigError, match="other is also a model route"):
        route_models(gateway=config.gateway, model="gemma-3-270m", served_name="gemma-3-270m", urls=URLS,
                     adapters={"other": tmp_path})  # fmt: skip
    elsewhere = _config(tmp_path, "gateway:\n  models:\n  - name: something-else\n")
    with pytest.raises(ConfigError, match="route for their base model"):
        route_models(gateway=elsewhere.gateway, model="gemma-3-270m", served_name="gemma-3-270m", urls=URLS,
                     adapters=dirs)  # fmt: skip


def test_adapter_paths_are_checked_before_the_engine_starts(tmp_path: Path) -> None:
    good = _peft_dir(tmp_path / "good", rank=8)
    config = EngineConfig(adapters=[{"name": "mine", "path": good}], max_lora_rank=8)  # type: ignore[list-item]
    assert resolve_adapters(engine=config) == {"mine": good.resolve()}
    big = _peft_dir(tmp_path / "big", rank=32)
    with pytest.raises(LocalStackError, match=r"rank 32.*max_lora_rank is 16"):
        resolve_adapters(engine=EngineConfig(adapters=[{"name": "big", "path": big}]))  # type: ignore[list-item]
    with pytest.raises(LocalStackError, match="not a readable PEFT config with a rank"):
        resolve_adapters(engine=EngineConfig(adapters=[{"name": "none", "path": tmp_path / "nowhere"}]))  # type: ignore[list-item]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(LocalStackError, match="not a readable PEFT config"):
        resolve_adapters(engine=EngineConfig(adapters=[{"name": "junk", "path": tmp_path / "junk"}]))  # type: ignore[list-item]


def test_packaged_adapters_live_in_the_cache_and_are_stamped_by_what_decides_them(tmp_path: Path) -> None:
    from fleetgate.local.adapter_train import TrainRecipe

    assert adapter_dir(name="pirate", cache_dir=tmp_path) == tmp_path / "adapters" / "gemma-3-270m" / "pirate"
    base = {"gguf_sha256": "abc", "dtype": "bfloat16"}
    pirate = expected_identity(name="pirate", base_manifest=base, recipe=TrainRecipe())
    assert pirate == expected_identity(name="pirate", base_manifest=base, recipe=TrainRecipe())
    assert (
        pirate["text_sha256"]
        != expected_identity(name="signoff", base_manifest=base, recipe=TrainRecipe())["text_sha256"]
    )
    assert pirate != expected_identity(name="pirate", base_manifest=base, recipe=TrainRecipe(steps=1))
    assert pirate != expected_identity(
        name="pirate", base_manifest={**base, "gguf_sha256": "def"}, recipe=TrainRecipe()
    )


def test_an_unknown_packaged_adapter_is_refused_before_any_work(tmp_path: Path) -> None:
    from fleetgate.local.adapter_prep import prepare_adapter

    with pytest.raises(ModelPrepError, match="unknown packaged adapter"):
        prepare_adapter(name="nope", cache_dir=tmp_path)
    assert not (tmp_path / "models").exists()


@pytest.fixture
def fake_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`prepare_adapter` around a stand-in for the base model and for training (which `adapter_train` does)."""
    from fleetgate.local import adapter_prep, adapter_train

    base = tmp_path / "base"
    base.mkdir()
    (base / "fleetgate-manifest.json").write_text(json.dumps({"gguf_sha256": "abc", "dtype": "bfloat16"}))
    monkeypatch.setattr(adapter_prep, "prepare_model", lambda **_: base)
    trained: list[str] = []

    def train(*, out: Path, pairs: list[tuple[str, str]], **_: object) -> adapter_train.TrainReport:
        trained.append(pairs[0][1])
        _peft_dir(out, rank=8)
        (out / "adapter_model.safetensors").write_bytes(b"x" * 100)
        return adapter_train.TrainReport(seconds=1.0, first_loss=4.0, last_loss=0.5, sample="Arr", precision="x")

    monkeypatch.setattr(adapter_train, "train_adapter", train)
    return trained


def test_a_packaged_adapter_is_trained_once_and_again_when_stale_or_damaged(
    tmp_path: Path, fake_training: list[str]
) -> None:
    from fleetgate.local.adapter_prep import prepare_adapter, prepare_adapters

    lines: list[str] = []
    path = prepare_adapter(name="pirate", cache_dir=tmp_path, progress=lines.append)
    assert path == adapter_dir(name="pirate", cache_dir=tmp_path) and len(fake_training) == 1
    assert (path / "adapter_config.json").is_file() and (path / "fleetgate-manifest.json").is_file()
    assert any("training LoRA adapter 'pirate'" in line for line in lines)
    assert prepare_adapter(name="pirate", cache_dir=tmp_path, progress=lines.append) == path
    assert len(fake_training) == 1  # reused: nothing trained
    (path / "adapter_model.safetensors").write_bytes(b"x")  # truncated
    prepare_adapter(name="pirate", cache_dir=tmp_path, progress=lines.append)
    assert len(fake_training) == 2
    manifest = json.loads((path / "fleetgate-manifest.json").read_text())
    (path / "fleetgate-manifest.json").write_text(json.dumps({**manifest, "adapter_recipe": 0}))  # stale
    prepare_adapter(name="pirate", cache_dir=tmp_path, progress=lines.append)
    assert len(fake_training) == 3
    prepare_adapter(name="pirate", cache_dir=tmp_path, force=True, progress=lines.append)
    assert len(fake_training) == 4
    paths = prepare_adapters(cache_dir=tmp_path, progress=lines.append)
    assert set(paths) == set(PACKAGED_ADAPTERS) and len(fake_training) == 5  # only signoff was new
    assert fake_training[-1].endswith("Over and out, FleetGate.")
    assert not [p for p in paths["pirate"].parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_prepare_adapters_command(tmp_path: Path, fake_training: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from fleetgate.cli import main

    assert main(["prepare-adapters", "signoff", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"signoff={adapter_dir(name='signoff', cache_dir=tmp_path)}"
    assert main(["prepare-adapters", "nope", "--cache-dir", str(tmp_path)]) == 1
    assert "unknown packaged adapter 'nope'" in capsys.readouterr().err


def test_up_check_asks_the_base_and_each_adapter_on_simulated_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetgate.cli import main

    monkeypatch.setenv("FLEETGATE_CACHE", str(tmp_path))  # simulated engines: nothing is trained or read
    rc = main(["up", "--engine", "sim", "--adapters", "--check", "--port", "0", "--engine-base-port", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.search(r"^A: .+$", out, re.M) and re.search(r"^A \(pirate\): .+$", out, re.M), out
    assert re.search(r"^A \(signoff\): .+$", out, re.M), out
    assert "LoRA adapters on 'gemma-3-270m', asked for by name: pirate, signoff" in err
    assert not (tmp_path / "adapters").exists() and not (tmp_path / "models").exists()


def test_two_preparations_at_once_train_once(
    tmp_path: Path, fake_training: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from fleetgate.local import adapter_prep, adapter_train

    slow = adapter_train.train_adapter

    def train(**kwargs: object) -> adapter_train.TrainReport:
        time.sleep(0.3)  # both callers find nothing prepared before the first one finishes
        return slow(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(adapter_train, "train_adapter", train)
    paths: list[Path] = []
    threads = [
        threading.Thread(target=lambda: paths.append(adapter_prep.prepare_adapter(name="pirate", cache_dir=tmp_path,
                                                                                  progress=lambda _: None)))
        for _ in range(2)
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(paths) == 2 and paths[0] == paths[1]
    assert len(fake_training) == 1  # the second waited on the lock, then found the adapter ready


def test_a_training_that_fails_leaves_nothing_behind_and_is_a_prep_error(
    tmp_path: Path, fake_training: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetgate.local import adapter_prep, adapter_train
    from fleetgate.local.errors import ModelPrepError

    def crash(*, out: Path, **_: object) -> adapter_train.TrainReport:
        _peft_dir(out, rank=8)  # half written when the process runs out of memory
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(adapter_train, "train_adapter", crash)
    with pytest.raises(ModelPrepError, match="training adapter 'pirate' failed: RuntimeError: DefaultCPUAllocator"):
        adapter_prep.prepare_adapter(name="pirate", cache_dir=tmp_path, progress=lambda _: None)
    root = adapter_dir(name="pirate", cache_dir=tmp_path).parent
    assert [p.name for p in root.iterdir()] == [".prepare.lock"]  # no adapter, no temporary directory


def test_up_trains_only_missing_packaged_adapters_and_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from fleetgate.local import adapter_prep, up

    ready = {"pirate": None, "signoff": "not prepared yet"}
    monkeypatch.setattr(adapter_prep, "needs_training", lambda *, name, **_: ready[name])
    runs: list[list[str]] = []
    exit_code = 0

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        runs.append(argv)
        return subprocess.CompletedProcess(argv, exit_code)

    monkeypatch.setattr(up.subprocess, "run", run)
    config = EngineConfig(adapters=["pirate", "signoff"], cache_dir=tmp_path)  # type: ignore[list-item]
    assert resolve_adapters(engine=config) == {
        "pirate": adapter_dir(name="pirate", cache_dir=tmp_path),
        "signoff": adapter_dir(name="signoff", cache_dir=tmp_path),
    }
    child = [sys.executable, "-m", "fleetgate.cli", "prepare-adapters", "signoff", "--cache-dir", str(tmp_path)]
    assert runs == [child]
    ready["signoff"] = None
    resolve_adapters(engine=config)
    assert len(runs) == 1  # all ready: no child
    ready["pirate"] = "corrupt: adapter_model.safetensors is missing or has the wrong size"
    exit_code = 1
    with pytest.raises(LocalStackError, match=r"fleetgate prepare-adapters pirate failed \(exit 1\)"):
        resolve_adapters(engine=config)
