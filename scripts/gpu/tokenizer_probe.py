"""Where the precise-prefix scorer's local tokenizer spends CPU on a many-core host (issue 24).

On the GPU host (32 cores) the gateway with `tokenizer: local` spent 17-24 ms of CPU per request against 5-7 ms
for the approximate scorer, while one encode of the same prompt takes ~2.3 ms on the 2-core development box.
This probe times `fleetgate.router.prompt_tokens._encode` (what the scorer runs) on the routing benchmark's
prompt shape (a 2,048-token shared system prompt and a 96-token question, Gemma 3 tokenizer), one child process
per environment setting (Rayon's pool is configured when the tokenizers library loads), wall and CPU time per
call (process CPU: every thread), serial and with 4 threads at once (the gateway's `asyncio.to_thread` pool).

    python3 scripts/gpu/tokenizer_probe.py [--archive build/gpu/gemma3-tokenizer.tar.xz] [--calls 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS: list[tuple[str, dict[str, str]]] = [
    ("default", {}),
    ("TOKENIZERS_PARALLELISM=false", {"TOKENIZERS_PARALLELISM": "false"}),
    ("RAYON_NUM_THREADS=1", {"RAYON_NUM_THREADS": "1"}),
]
WORDS = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "tau", "rho", "zeta", "theta", "lambda"]


def child(folder: str, calls: int) -> dict[str, float]:
    import random
    from concurrent.futures import ThreadPoolExecutor

    from fleetgate.router.prompt_tokens import _encode, _load_tokenizer

    tok = _load_tokenizer(folder)
    rng = random.Random(24)
    system = " ".join(rng.choice(WORDS) for _ in range(2600))
    bodies = [{"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(120))}]}
              for _ in range(calls)]
    n_tokens = len(_encode(tok, bodies[0]))
    walls, cpus = [], []
    for body in bodies:
        w, c = time.perf_counter(), time.process_time()
        _encode(tok, body)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    w, c = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: _encode(tok, b), bodies))
    par_wall, par_cpu = time.perf_counter() - w, time.process_time() - c
    return {"tokens": n_tokens, "wall_ms_p50": 1e3 * statistics.median(walls),
            "cpu_ms_p50": 1e3 * statistics.median(cpus), "threads4_wall_ms_per_call": 1e3 * par_wall / calls,
            "threads4_cpu_ms_per_call": 1e3 * par_cpu / calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, default=Path("build/gpu/gemma3-tokenizer.tar.xz"))
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.calls)))
        return
    import shutil

    folder = tempfile.mkdtemp(prefix="tokprobe-")
    shutil.unpack_archive(str(args.archive), folder)
    found = next(Path(folder).rglob("tokenizer.json")).parent
    print(f"cpus {os.cpu_count()}; tokenizer {found}", flush=True)
    for name, env in SETTINGS:
        out = subprocess.run([sys.executable, __file__, "--child", str(found), "--calls", str(args.calls)],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
        print(f"{name}: {line}", flush=True)


if __name__ == "__main__":
    main()
