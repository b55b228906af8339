"""The live benchmark's py-spy sampling of a gateway point: the sampler's command, and the summary."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from fleetgate.bench import live_pyspy

STACKS = """\
<module> (gateway/serve.py:10);run (uvloop:1);relay (gateway/sse.py:120);loads (orjson:1) 30
<module> (gateway/serve.py:10);run (uvloop:1);relay (gateway/sse.py:141) 10
<module> (gateway/serve.py:10);run (uvloop:1);pick (router/scheduler.py:50) 60
not a stack line
"""


def test_summary_counts_own_and_inclusive_samples_per_function() -> None:
    s = live_pyspy.summary(live_pyspy.parse(STACKS))
    assert s["samples"] == 100
    own = dict(s["own"])  # type: ignore[arg-type]
    assert own == {"pick (scheduler.py)": 0.6, "loads (orjson)": 0.3, "relay (sse.py)": 0.1}
    inclusive = dict(s["inclusive"])  # type: ignore[arg-type]
    # two lines of one function count as one function; a frame counts once per stack
    assert inclusive["relay (sse.py)"] == 0.4
    assert inclusive["run (uvloop)"] == 1.0


def test_point_file_names_are_safe(tmp_path: Path) -> None:
    path = live_pyspy.point_file(tmp_path, "shared-prefix x1.2 precise-local [routing] via envoy+epp")
    assert path.parent == tmp_path and path.name == "shared-prefix_x1.2_precise-local_routing_via_envoy_epp.txt"


def test_no_binary_no_sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETGATE_PY_SPY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert live_pyspy.start(os.getpid(), tmp_path / "x.txt", duration_s=1) is None
    live_pyspy.finish(None)


def test_sampler_runs_without_stopping_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "py-spy"  # records its argv where py-spy would write its stacks
    fake.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
                    "open(args[args.index('-o') + 1], 'w').write(' '.join(args))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FLEETGATE_PY_SPY", str(fake))
    out = tmp_path / "samples" / "point.txt"
    live_pyspy.finish(live_pyspy.start(4242, out, duration_s=2.4))
    argv = out.read_text().split()
    assert argv[:3] == ["record", "--pid", "4242"]
    assert "--nonblocking" in argv and argv[argv.index("--duration") + 1] == "2"
    assert argv[argv.index("--format") + 1] == "raw"


def test_cli_prints_the_busiest_functions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a.txt"
    f.write_text(STACKS)
    assert live_pyspy.main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "100 samples" in out and "60.0%  pick (scheduler.py)" in out
    assert live_pyspy.main([]) == 2
