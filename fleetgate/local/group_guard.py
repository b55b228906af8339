"""The leader of one engine's process group: runs the engine and ends the whole group with it.

`python -P .../fleetgate/local/group_guard.py GRACE_S -- ENGINE_ARGV...` (stdlib only, run by path)

PR_SET_PDEATHSIG only signals the process `fleetgate up` started. When that process was the engine
itself, an engine killed that way left its own children behind (vLLM's engine core, or any helper it
spawned), re-parented to init: a test that SIGKILLs `fleetgate up` left an orphaned `sleep` running for
ten minutes. So `EngineFleet` starts this guard instead, with the death signal set; the guard runs the
engine in its own process group and, when it gets SIGTERM (a stop, or `fleetgate up` died), passes it to
the whole group, waits `GRACE_S` for the engine, then SIGKILLs whatever is left of the group, itself
included. When the engine exits by itself, the guard ends the group the same way and exits with the
engine's code (128 + N for a signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

POLL_S = 0.1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: group_guard.py GRACE_S -- ENGINE_ARGV...", file=sys.stderr)
        return 2
    grace_s = float(argv[0])
    engine = subprocess.Popen(argv[2:])  # stdio and the process group are the guard's
    stopping: list[int] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)  # the work happens in the loop below, not in the handler

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is `fleetgate up`'s to handle
    while (code := engine.poll()) is None and not stopping:
        time.sleep(POLL_S)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGTERM)  # the engine (if still running) and anything it started
    if code is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.wait(timeout=grace_s)
        os.killpg(0, signal.SIGKILL)  # what ignored SIGTERM, and the guard itself
    assert code is not None
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
