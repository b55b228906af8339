"""The engine image's entrypoint: argv and environment handling, bad input, and the real exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgate.engine.args import VLLM_MODULE, EngineArgs
from fleetgate.engine_image.entrypoint import EntrypointError, build_command, main

ENTRYPOINT = Path(__file__).resolve().parents[2] / "engine_image" / "entrypoint.py"


def test_flags_from_engine_args_pass_through_verbatim() -> None:
    argv = EngineArgs(model="/models/m", served_model_name="m", host="0.0.0.0", port=8000,
                      enable_prefix_caching=True).to_argv()
    command, env = build_command(argv=argv, env={}, python="/usr/bin/python3")
    assert command == ["/usr/bin/python3", "-m", VLLM_MODULE, *argv]
    assert env["HF_HOME"] == "/model-cache"
    assert env["VLLM_NO_USAGE_STATS"] == "1"


def test_host_and_port_are_added_only_when_missing() -> None:
    command, _ = build_command(argv=["--model", "m"], env={"FLEETGATE_ENGINE_PORT": "9000"}, python="py")
    assert command[3:] == ["--model", "m", "--port", "9000", "--host", "0.0.0.0"]
    command, _ = build_command(argv=["--model=m", "--port=8100", "--host", "127.0.0.1"], env={}, python="py")
    assert command[3:] == ["--model=m", "--port=8100", "--host", "127.0.0.1"]


def test_environment_defaults_never_override_what_is_set() -> None:
    _, env = build_command(argv=["--model", "m"], env={"HF_HOME": "/cache", "VLLM_NO_USAGE_STATS": "0"}, python="p")
    assert (env["HF_HOME"], env["VLLM_NO_USAGE_STATS"]) == ("/cache", "0")
    assert "HF_HUB_OFFLINE" not in env
    _, env = build_command(argv=["--model", "m"], env={"FLEETGATE_OFFLINE": "1"}, python="p")
    assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"]) == ("1", "1")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--model is required"),
        (["--served-model-name", "x"], {}, "--model is required"),
        (["--model"], {}, "--model needs a value"),
        (["--model", "a", "--model", "b"], {}, "--model given 2 times"),
        (["--model", "a", "--port", "http"], {}, "--port must be a port number"),
        (["--model", "a", "--port", "70000"], {}, "within 1..65535"),
        (["--model", "a"], {"FLEETGATE_ENGINE_PORT": "x"}, "FLEETGATE_ENGINE_PORT must be a port number"),
        (["serve", "--model", "a"], {}, "pass only the flags"),
    ],
)
def test_bad_input_is_refused(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(EntrypointError, match=message):
        build_command(argv=argv, env=env, python="py")


def test_main_exits_2_with_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "8000"], {}) == 2
    err = capsys.readouterr().err
    assert err.startswith("fleetgate engine entrypoint: --model is required")
    assert err.count("\n") == 1


def test_dry_run_prints_the_command_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "m"], {"FLEETGATE_ENTRYPOINT_DRY_RUN": "1"}) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["command"][1:4] == ["-m", VLLM_MODULE, "--model"]
    assert out["env"] == {"HF_HOME": "/model-cache", "VLLM_NO_USAGE_STATS": "1"}


def test_standalone_file_execs_the_server_module(tmp_path: Path) -> None:
    # The images copy entrypoint.py alone: run it as a plain script, with a stand-in `vllm` package on
    # PYTHONPATH whose server module records what it was started with, to prove the exec happens.
    server = tmp_path / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for pkg in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", server):
        (pkg / "__init__.py").write_text("")
    (server / "api_server.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(), 'hf_home': os.environ.get('HF_HOME')}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONSAFEPATH": "1"}
    env.pop("HF_HOME", None)
    proc = subprocess.Popen(
        [sys.executable, str(ENTRYPOINT), "--model", "/models/m", "--port", "8123"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out)
    assert seen["pid"] == proc.pid, "the server must replace the entrypoint (exec), not run as its child"
    assert seen["argv"] == ["--model", "/models/m", "--port", "8123", "--host", "0.0.0.0"]
    assert seen["hf_home"] == "/model-cache"
