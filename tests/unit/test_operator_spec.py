"""The typed spec: defaults, cross-field rules (twins of the CRD's CEL rules) and model resolution."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.engine.args import KV_CACHE_DTYPES, QUANTIZATIONS
from fleetgate.operator.profiles import Profiles, load_profiles
from fleetgate.operator.resolve import locate_model, resolve
from fleetgate.operator.spec import InferenceServiceSpec, KvCacheDtype, Quantization, parse_spec

BASE: dict[str, Any] = {"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}}


def test_defaults() -> None:
    spec = parse_spec(BASE)
    assert spec.replicas == 1
    assert spec.engine.max_model_len == 8192 and spec.engine.prefix_caching is True
    assert spec.engine.quantization == "none" and spec.resources.gpus == 1


def test_spec_enums_are_known_to_engine_args() -> None:
    from typing import get_args

    assert set(get_args(Quantization)) - {"none"} <= set(QUANTIZATIONS)
    assert set(get_args(KvCacheDtype)) <= set(KV_CACHE_DTYPES)


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"engine": {"tensorParallelSize": 4}, "resources": {"gpus": 2}}, "tensorParallelSize"),
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas"),
        ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}, "scaleToZero"),
        ({"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}, "replicas"),
        ({"engine": {"speculative": {"method": "eagle"}}}, "draftModel"),
        ({"engine": {"speculative": {"method": "ngram", "draftModel": "x/y"}}}, "draftModel"),
        ({"engine": {"maxModelLen": 8}}, "maxModelLen"),
        ({"engine": {"unknownKnob": 1}}, "unknownKnob"),
        ({"model": {"source": "gs://bucket/x"}}, "source"),
        ({"adapters": [{"name": "a", "source": "/a"}, {"name": "a", "source": "/b"}]}, "duplicate"),
        ({"adapters": [{"name": "Bad_Name", "source": "/a"}]}, "name"),
        ({"adapters": [{"name": "a", "source": "ftp://x/y"}]}, "source"),
        ({"adapters": [{"name": "a", "source": "/a", "rank": 32}]}, "maxLoraRank"),
        ({"engine": {"maxLoraRank": 24}}, "maxLoraRank"),
        ({"engine": {"maxAdapters": 0}}, "maxAdapters"),
    ],
)
def test_invalid_specs_name_the_field(patch: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        parse_spec({**BASE, **patch})


def test_snake_case_and_camel_case_both_accepted() -> None:
    spec = InferenceServiceSpec.model_validate({**BASE, "engine": {"max_model_len": 4096}})
    assert spec.engine.max_model_len == 4096


@pytest.mark.parametrize(
    ("source", "arg", "claim"),
    [
        ("hf://org/model", "org/model", None),
        ("pvc://models-pvc/llama/8b", "/models/models-pvc/llama/8b", "models-pvc"),
        ("s3://bucket/llama", "s3://bucket/llama", None),
        ("/opt/model", "/opt/model", None),
    ],
)
def test_model_sources(source: str, arg: str, claim: str | None) -> None:
    loc = locate_model(source=source)
    assert (loc.model_arg, loc.pvc_claim) == (arg, claim)
    if source.startswith("s3://"):
        assert loc.extra_args == ("--load-format", "runai_streamer")


def test_resolve_uses_catalog_and_profile() -> None:
    resolved = resolve(spec=parse_spec(BASE), name="llama", profiles=Profiles())
    assert resolved.profile.name == "nvidia-l4"
    assert resolved.plan is not None and resolved.plan.fits
    assert resolved.served_model == "llama"
    argv = resolved.engine_args.to_argv()
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--served-model-name") + 1] == "llama"


def test_resolve_without_architecture_explains() -> None:
    resolved = resolve(spec=parse_spec({"model": {"source": "hf://acme/mystery"}}), name="m", profiles=Profiles())
    assert resolved.plan is None
    assert "spec.model.architecture" in resolved.plan_note


def test_explicit_architecture_wins_over_catalog() -> None:
    arch = {"parametersBillions": 70, "layers": 80, "kvHeads": 8, "headDim": 128}
    spec = parse_spec({"model": {"source": "hf://acme/mystery", "architecture": arch}})
    resolved = resolve(spec=spec, name="m", profiles=Profiles())
    assert resolved.plan is not None and resolved.plan.weight_bytes == 140 * 10**9


def test_unknown_accelerator_and_gpu_mismatch_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown accelerator"):
        resolve(spec=parse_spec({**BASE, "resources": {"accelerator": "tpu-v9"}}), name="m", profiles=Profiles())
    with pytest.raises(ConfigError, match="gpus to 0"):
        resolve(spec=parse_spec({**BASE, "resources": {"accelerator": "cpu"}}), name="m", profiles=Profiles())


def test_profiles_file_overrides_and_adds(tmp_path: Any) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "nvidia-l4:\n  node_selector: {pool: l4}\n"
        "acme-x1:\n  gpu_memory_bytes: 100000000000\n  resource_name: acme.com/gpu\n  tolerations: []\n"
    )
    profiles = load_profiles(path=path, default="acme-x1")
    assert profiles.resolve(name="nvidia-l4").node_selector == {"pool": "l4"}
    assert profiles.resolve(name=None).resource_name == "acme.com/gpu"
    path.write_text("nvidia-l4:\n  no_such_field: 1\n")
    with pytest.raises(ConfigError, match="no_such_field"):
        load_profiles(path=path)


def test_adapters_turn_lora_on_and_stay_out_of_the_flags() -> None:
    spec = parse_spec(
        {**BASE, "engine": {"maxAdapters": 2, "maxLoraRank": 32},
         "adapters": [{"name": "sql", "source": "hf://me/sql", "rank": 32, "tenant": "acme"},
                      {"name": "legal", "source": "pvc://loras/legal"}]}
    )  # fmt: skip
    assert spec.lora_enabled and spec.adapters[0].tenant == "acme"
    resolved = resolve(spec=spec, name="llama", profiles=Profiles())
    argv = resolved.engine_args.to_argv()
    assert argv[argv.index("--max-loras") + 1] == "2" and argv[argv.index("--max-lora-rank") + 1] == "32"
    assert "--lora-modules" not in argv  # loaded at runtime: the pod template does not change with them
    assert [(a.name, a.path, a.pvc_claim) for a in resolved.adapters] == [
        ("sql", "me/sql", None), ("legal", "/models/loras/legal", "loras")
    ]  # fmt: skip
    assert resolved.volume_claims() == ("loras",)
    assert not parse_spec(BASE).lora_enabled
    assert parse_spec({**BASE, "engine": {"maxAdapters": 1}}).lora_enabled  # LoRA on, no adapter yet


@pytest.mark.parametrize(
    ("adapter", "needle"),
    [({"name": "llama", "source": "/a"}, "served model's name"), ({"name": "a", "source": "s3://b/a"}, "s3://")],
)
def test_adapters_refused_at_resolution(adapter: dict[str, Any], needle: str) -> None:
    """The resource name is the served name when servedName is unset: only resolution knows it."""
    with pytest.raises(ConfigError, match=needle):
        resolve(spec=parse_spec({**BASE, "adapters": [adapter]}), name="llama", profiles=Profiles())
