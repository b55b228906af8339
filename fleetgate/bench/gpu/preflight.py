"""vLLM's own verdict on engine arguments, without starting an engine: parse them, build the engine config.

`python -m fleetgate.bench.gpu.preflight IN.jsonl OUT.jsonl` reads one `{"name", "argv"}` object per line
(the arguments after `python -m vllm.entrypoints.openai.api_server`), and for each writes
`{"name", "ok", "stage", "error"}` as soon as it is known: `stage` "parse" (vLLM's argument parser
refused a flag or value) or "config" (`AsyncEngineArgs.create_engine_config`, which loads config.json and
checks the scheduler, cache, parallel, speculative, LoRA and quantization settings against each other and
the platform). It runs in its own process, before any engine, so that refusals cost no GPU time and its
import of vLLM warms the caches the engines then use. The parser lives in
`vllm.entrypoints.openai.cli_args` (0.26) or `vllm.entrypoints.launchers.cli_args` (0.32).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def _parser() -> Any:
    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def check(argv: list[str]) -> dict[str, Any]:
    """{"ok": True} or the stage and vLLM's message."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    parser = _parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            namespace = parser.parse_args(argv)
    except SystemExit:
        said = errors.getvalue().strip().splitlines()
        return {"ok": False, "stage": "parse", "error": (said[-1] if said else "argument parser exited")[:800]}
    except Exception as exc:
        return {"ok": False, "stage": "parse", "error": f"{type(exc).__name__}: {exc}"[:800]}
    try:
        AsyncEngineArgs.from_cli_args(namespace).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as exc:  # vLLM raises ValueError, pydantic's ValidationError, NotImplementedError, ...
        return {"ok": False, "stage": "config", "error": f"{type(exc).__name__}: {exc}"[:800]}
    return {"ok": True}


def main(argv: list[str]) -> int:
    source, target = argv
    import vllm

    with open(source) as inp, open(target, "a") as out:
        out.write(json.dumps({"name": "__vllm__", "version": vllm.__version__}) + "\n")
        out.flush()
        for line in inp:
            item = json.loads(line)
            verdict = check(list(item["argv"]))
            out.write(json.dumps({"name": item["name"], **verdict}) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
