"""Where a door spends its CPU during a live point: py-spy samples of the gateway process, summarised.

The GPU runs measured the gateway's CPU per request (precise routing 6.8-8.5 ms against ~5 ms for the
default) but not where it goes. With `--py-spy-dir DIR` (and a `py-spy` binary on PATH or in
`$FLEETGATE_PY_SPY`), every gateway point records py-spy's collapsed stacks of its gateway over the
point's window into `DIR/<point>.txt`, sampled without stopping the process (`--nonblocking`: a blocking
sampler pauses the gateway at each sample, which would add to the latency being measured). A machine
without py-spy, or one that forbids reading another process's memory, records nothing and says so once.

`python -m fleetgate.bench.live_pyspy FILE...` prints each file's busiest functions: own samples (the
frame at the top of the stack) and inclusive samples (the frame anywhere in the stack), as shares of the
samples taken while the process was running Python (idle samples are not recorded).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE_HZ = 100


def binary() -> str | None:
    """The py-spy executable: `$FLEETGATE_PY_SPY` when set, else the one on PATH."""
    return os.environ.get("FLEETGATE_PY_SPY") or shutil.which("py-spy")


def point_file(out_dir: Path, point: str) -> Path:
    return out_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", point).strip("_") + ".txt")


def start(pid: int, out: Path, *, duration_s: float) -> subprocess.Popen[bytes] | None:
    """Sample `pid` for `duration_s` into `out` (collapsed stacks); None without a py-spy binary."""
    exe = binary()
    if exe is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [exe, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--duration", str(max(1, round(duration_s))),
            "--format", "raw", "--nonblocking", "-o", str(out)]
    log = out.with_suffix(".log").open("wb")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def finish(proc: subprocess.Popen[bytes] | None, *, timeout_s: float = 15.0) -> None:
    """Wait for the sampler to write its file; stop it if it overstays."""
    if proc is None:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()


def parse(text: str) -> Counter[tuple[str, ...]]:
    """Collapsed stacks (`frame;frame;... COUNT`, root first) as a counter of frame tuples."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def _function(frame: str) -> str:
    """`name (path/to/file.py:LINE)` -> `name (file.py)`: lines of one function count together."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rsplit(':', 1)[0]).name})" if where else name


def summary(stacks: Counter[tuple[str, ...]], *, top: int = 15) -> dict[str, object]:
    """The busiest functions by own and by inclusive samples, as shares of all samples."""
    total = sum(stacks.values())
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, n in stacks.items():
        functions = [_function(f) for f in stack]
        if functions:
            own[functions[-1]] += n
        for name in set(functions):
            inclusive[name] += n
    share = (lambda n: round(n / total, 4)) if total else (lambda n: 0.0)
    return {"samples": total,
            "own": [(name, share(n)) for name, n in own.most_common(top)],
            "inclusive": [(name, share(n)) for name, n in inclusive.most_common(top)]}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m fleetgate.bench.live_pyspy FILE...", file=sys.stderr)
        return 2
    for path in argv:
        s = summary(parse(Path(path).read_text(encoding="utf-8", errors="replace")))
        print(f"== {path}: {s['samples']} samples")
        for title in ("own", "inclusive"):
            print(f"  {title}:")
            for name, frac in s[title]:  # type: ignore[attr-defined]
                print(f"    {frac:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
