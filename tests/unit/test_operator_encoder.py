"""An InferenceService that serves embeddings (`engine.task: embed`): its vLLM flags, its capacity plan, its
status, and how the gateway's discovery marks its model."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from fleetgate.core.errors import ConfigError
from fleetgate.engine.args import EngineArgs
from fleetgate.engine.capacity import GB
from fleetgate.engine.encoder_capacity import EncoderPlan, lookup_encoder, plan_encoder
from fleetgate.gateway.discovery import ModelListing, StaticEndpointSource, models_page, task_of
from fleetgate.gateway.discovery.kubernetes import KubernetesEndpointSource, service_info
from fleetgate.gateway.settings import ModelRoute
from fleetgate.operator.builders import Owner, build_children
from fleetgate.operator.plan_cli import _text
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.settings import OperatorSettings
from fleetgate.operator.spec import parse_spec
from fleetgate.operator.status import compute_status

ENCODER = {"model": {"source": "hf://sentence-transformers/all-MiniLM-L6-v2", "servedName": "all-minilm-l6-v2"},
           "engine": {"task": "embed", "dtype": "float32", "gpuMemoryUtilization": 0.05},
           "resources": {"accelerator": "nvidia-h100-80gb", "gpus": 1}}


def _resolve(spec: dict[str, Any]) -> Any:
    return resolve(spec=parse_spec(spec), name="minilm", profiles=Profiles())


def _with_engine(**engine: Any) -> dict[str, Any]:
    return {**ENCODER, "engine": {**ENCODER["engine"], **engine}}


def test_task_embed_runs_the_pooling_runner_at_the_encoders_own_length() -> None:
    argv = _resolve(ENCODER).engine_args.to_argv()
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert argv[argv.index("--max-model-len") + 1] == "256"  # not the spec's 8192: vLLM would refuse it
    assert argv[argv.index("--dtype") + 1] == "float32"
    # vLLM 0.26 warns that forcing prefix caching on an encoder "may crash or produce incorrect outputs"
    assert not [a for a in argv if "prefix-caching" in a or "chunked-prefill" in a]
    generative = _resolve({"model": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}}).engine_args.to_argv()
    assert "--runner" not in generative and "--enable-prefix-caching" in generative


def test_an_explicit_length_is_kept_unless_the_encoder_cannot_take_it() -> None:
    argv = _resolve(_with_engine(maxModelLen=128)).engine_args.to_argv()
    assert argv[argv.index("--max-model-len") + 1] == "128"
    with pytest.raises(ConfigError, match="exceeds the encoder's 256 positions"):
        _resolve(_with_engine(maxModelLen=512))
    unknown = {**ENCODER, "model": {"source": "hf://BAAI/bge-small-en-v1.5"}}
    assert "--max-model-len" not in _resolve(unknown).engine_args.to_argv()  # vLLM reads the model's own


@pytest.mark.parametrize("engine, message", [
    ({"speculative": {"method": "ngram"}}, "speculative decoding needs task generate"),
    ({"chunkedPrefill": True}, "runs without chunked prefill"),
])
def test_what_an_encoder_cannot_do_is_refused(engine: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_spec(_with_engine(**engine))


@pytest.mark.parametrize("flag", ["--task", "--task=embed", "--runner"])
def test_the_removed_task_flag_and_the_owned_runner_flag_are_refused_in_extra_args(flag: str) -> None:
    with pytest.raises(ConfigError, match=r"engine\.task|typed field"):
        EngineArgs(model="m", extra_args=(flag, "embed") if "=" not in flag else (flag,))
    with pytest.raises(ConfigError, match="speculative"):
        EngineArgs(model="m", runner="pooling", speculative_method="ngram", num_speculative_tokens=2)


def test_the_encoder_plan_counts_weights_and_sequences_not_kv() -> None:
    plan = _resolve(ENCODER).plan
    assert isinstance(plan, EncoderPlan) and plan.fits and plan.meets_target
    assert plan.weight_bytes == 22_713_216 * 4  # float32
    assert plan.sequences_per_step_at_max_length == 8192 // 256  # the H100 profile's 8192-token step
    assert plan.sequences_per_step_short == 8192 // 32
    status = plan.to_status()
    assert status["kind"] == "encoder" and status["kvCacheTokens"] == 0 and status["usableGbPerGpu"] == "4.28"
    capped = _resolve(_with_engine(maxNumSeqs=100)).plan
    assert capped.sequences_per_step_short == 100 and capped.sequences_per_step_at_max_length == 32


def test_an_encoder_that_does_not_fit_says_why() -> None:
    arch, _ = lookup_encoder("all-MiniLM-L6-v2") or (None, 0)
    assert arch is not None
    tiny = plan_encoder(arch=arch, dtype="float32", max_model_len=256, max_num_batched_tokens=8192, max_num_seqs=None,
                        gpu_memory_bytes=80 * GB, gpu_memory_utilization=0.01, overhead_bytes=2 * GB)
    assert not tiny.fits and "weights do not fit" in tiny.reason
    short_step = plan_encoder(arch=arch, dtype="float32", max_model_len=256, max_num_batched_tokens=128,
                              max_num_seqs=None, gpu_memory_bytes=80 * GB, gpu_memory_utilization=0.5,
                              overhead_bytes=2 * GB)
    assert not short_step.fits and "never split" in short_step.reason
    cpu = plan_encoder(arch=arch, dtype="float32", max_model_len=256, max_num_batched_tokens=2048, max_num_seqs=16,
                       gpu_memory_bytes=0, gpu_memory_utilization=0.9, overhead_bytes=0)
    assert cpu.fits and cpu.sequences_per_step_short == 16 and "CPU engine" in cpu.reason


def test_status_and_the_plan_text_of_an_encoder() -> None:
    spec = parse_spec(ENCODER)
    resolved = resolve(spec=spec, name="minilm", profiles=Profiles())
    owner = Owner(name="minilm", namespace="ns", uid="u", generation=1)
    children = build_children(owner=owner, spec=spec, resolved=resolved, settings=OperatorSettings())
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    assert "--runner" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    status = compute_status(owner=owner, spec=spec, resolved=resolved, invalid=None, deployment=None, previous=None,
                            now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    planned = next(c for c in status["conditions"] if c["type"] == "CapacityPlanned")
    assert (planned["status"], planned["reason"]) == ("True", "Fits") and "no KV cache" in planned["message"]
    assert status["capacityPlan"]["kind"] == "encoder"
    text = _text(resolved)
    assert "KV cache:" in text and "none (encoder" in text and "--runner pooling" in text


def test_discovery_marks_an_encoders_model_as_an_embedding_model() -> None:
    body = {"metadata": {"name": "minilm", "namespace": "ml"}, "spec": ENCODER, "status": {}}
    info = service_info(body)
    assert info is not None and info.task == "embed" and info.labels["task"] == "embed"
    source = KubernetesEndpointSource(client_factory=None, namespace="ml", label_selector="a=b")
    source.apply_event("isvc", "ADDED", body)
    llm = {"metadata": {"name": "llm", "namespace": "ml"}, "spec": {"model": {"source": "hf://x/llm"}}}
    source.apply_event("isvc", "ADDED", llm)
    assert task_of(source, "all-minilm-l6-v2") == "embed" and task_of(source, "llm") == "generate"
    static = StaticEndpointSource([ModelRoute(name="enc", endpoints=["http://127.0.0.1:1"], task="embed"),
                                   ModelRoute(name="chat", endpoints=["http://127.0.0.1:2"])])
    assert [m.task for m in (ModelListing(name="x", ready=True),)] == ["generate"]
    page = orjson.loads(models_page(static, aliases=[], allowed=None))
    assert {m["id"]: m["fleetgate"].get("task") for m in page["data"]} == {"enc": "embed", "chat": None}
