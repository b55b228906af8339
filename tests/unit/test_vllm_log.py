"""Reading vLLM's start-up log: excerpts written from vLLM 0.26.0's format strings (gpu_worker.py,
gpu_model_runner.py, kv_cache_utils.py, mem_utils.py, core.py, platforms/cuda.py) and 0.32's CPU line."""

from __future__ import annotations

import pytest

from fleetgate.engine.vllm_log import EngineLogReport, failure_reason, parse_engine_log

# One H100, Llama-3.1-8B-shaped, bf16, CUDA graphs: the lines of one start-up in the order vLLM writes them.
GPU_LOG = """\
(APIServer pid=101) INFO 11-27 13:40:02 [api_server.py:1900] vLLM API server version 0.26.0
(EngineCore pid=180) INFO 11-27 13:40:20 [cuda.py:483] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(EngineCore pid=180) INFO 11-27 13:40:26 [gpu_model_runner.py:5348] Model loading took 17.05 GiB memory and 4.812345 seconds
(EngineCore pid=180) INFO 11-27 13:41:05 [gpu_model_runner.py:6620] Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)
(EngineCore pid=180) INFO 11-27 13:41:09 [gpu_model_runner.py:6730] Estimated CUDA graph memory: 0.47 GiB total
(EngineCore pid=180) INFO 11-27 13:41:09 [gpu_worker.py:561] Available KV cache memory: 51.86 GiB
(EngineCore pid=180) INFO 11-27 13:41:10 [kv_cache_utils.py:2177] GPU KV cache size: 424,864 tokens
(EngineCore pid=180) INFO 11-27 13:41:10 [kv_cache_utils.py:2178] Maximum concurrency for 8,192 tokens per request: 51.86x
(EngineCore pid=180) INFO 11-27 13:41:31 [gpu_model_runner.py:6845] Graph capturing finished in 19 secs, took 0.95 GiB
(EngineCore pid=180) INFO 11-27 13:41:31 [gpu_worker.py:795] CUDA graph pool memory: 0.95 GiB (actual), 0.47 GiB (estimated), difference: 0.48 GiB (50.5%).
(EngineCore pid=180) INFO 11-27 13:41:31 [gpu_worker.py:856] Free memory on device (79.1/79.65 GiB) on startup. Desired GPU memory utilization is (0.9, 71.68 GiB). Actual usage is 17.05 GiB for weight, 2.1 GiB for peak activation, 0.2 GiB for non-torch memory, and 0.95 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=54926098432` (51.15 GiB) to fit into requested memory, or `--kv-cache-memory=62664155136` (58.36 GiB) to fully utilize gpu memory. Current kv cache memory in use is 51.86 GiB.
(EngineCore pid=180) INFO 11-27 13:41:33 [core.py:341] init engine (profile, create kv cache, warmup model) took 66.92 s (compilation: 38.10 s)
(APIServer pid=101) INFO 11-27 13:41:35 [api_server.py:677] Starting vLLM server on http://127.0.0.1:8000
"""  # noqa: E501


def test_reads_every_figure_of_a_gpu_start() -> None:
    report = parse_engine_log(GPU_LOG)
    assert report == EngineLogReport(
        weights_gib=17.05, load_seconds=4.812345, available_kv_gib=51.86, kv_device="GPU", kv_tokens=424_864,
        max_model_len=8192, max_concurrency=51.86, total_gib=79.65, free_gib=79.1, requested_gib=71.68,
        activation_gib=2.1, non_torch_gib=0.2, cuda_graph_gib=0.95, cuda_graph_estimate_gib=0.47,
        cuda_graphs={"PIECEWISE": 51, "FULL": 51}, init_engine_seconds=66.92, compile_seconds=38.10,
        attention_backend="FLASH_ATTN",
    )  # fmt: skip


def test_tensor_parallel_keeps_rank_zero_and_strips_colour() -> None:
    log = (
        "\x1b[36m(Worker_TP0 pid=11)\x1b[0m INFO 11-27 14:00:01 [gpu_model_runner.py:5348] Model loading took "
        "35.9 GiB memory and 20.1 seconds\n"
        "\x1b[36m(Worker_TP1 pid=12)\x1b[0m INFO 11-27 14:00:01 [gpu_model_runner.py:5348] Model loading took "
        "36.1 GiB memory and 20.3 seconds\n"
        "(Worker_TP0 pid=11) INFO 11-27 14:00:40 [gpu_worker.py:561] Available KV cache memory: 32.4 GiB\n"
        "(Worker_TP1 pid=12) INFO 11-27 14:00:40 [gpu_worker.py:561] Available KV cache memory: 32.2 GiB\n"
        "(EngineCore pid=9) INFO 11-27 14:00:41 [kv_cache_utils.py:2177] GPU KV cache size: 210,896 tokens\n"
    )
    report = parse_engine_log(log)
    assert (report.weights_gib, report.available_kv_gib, report.kv_tokens) == (35.9, 32.4, 210_896)
    assert report.max_concurrency is None  # a line not (yet) written is None, not a guess


def test_reads_the_one_line_form_of_vllm_032_on_cpu() -> None:
    line = (
        "(EngineCore pid=1270) INFO 11-24 09:31:40 [kv_cache_utils.py:2327] CPU KV cache size: 163,271 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 39.86x"
    )
    report = parse_engine_log(line)
    assert (report.kv_device, report.kv_tokens, report.max_model_len, report.max_concurrency) == (
        "CPU", 163_271, 4096, 39.86,
    )  # fmt: skip
    assert report.weights_gib is None and report.cuda_graphs == {}


def test_eager_start_without_compilation() -> None:
    report = parse_engine_log(
        "(EngineCore pid=5) INFO 11-27 14:02:00 [core.py:348] init engine (profile, create kv cache, warmup model) "
        "took 9.41 s\n"
    )
    assert (report.init_engine_seconds, report.compile_seconds) == (9.41, None)


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (
            "(APIServer pid=1) ERROR 11-27 14:03:00 [core.py:900] EngineCore failed to start.\n"
            "Traceback (most recent call last):\n"
            '  File "/x/vllm/config/scheduler.py", line 287, in verify_max_model_len\n'
            "(APIServer pid=1) ValueError: max_num_batched_tokens (8192) must be greater than or equal to "
            "max_num_seqs (16384).\n"
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
            "ValueError: max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (16384).",
        ),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
            "  Value error, Either prompt_lookup_max or prompt_lookup_min must be provided when using the ngram "
            "method. [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]\n",
            "Value error, Either prompt_lookup_max or prompt_lookup_min must be provided when using the ngram "
            "method. [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
        ),
        (
            "(EngineCore pid=3) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ),
        (
            "(Worker pid=27873) ERROR 11-27 14:07:46 [multiproc_executor.py:953] ValueError: When using LoRA, vocab "
            "size must be <= 258048\n"
            "(EngineCore pid=26900) Exception: WorkerProc initialization failed due to an exception in a background "
            "process. See stack trace for root cause.\n",
            "ValueError: When using LoRA, vocab size must be <= 258048",
        ),
        ("INFO all good\n", None),
    ],
)
def test_failure_reason_is_the_root_cause(log: str, reason: str | None) -> None:
    assert failure_reason(log) == reason
