#!/usr/bin/env python3
"""Pack this machine's redis-server for the offline GPU machine, which has none (`--gateway-replicas` needs one).

The archive `build/gpu/redis.tar.xz` (a carry path, a few MiB) holds one folder, `redis/`:

- `bin/redis-server`: the binary (Debian installs it as `redis-check-rdb` with `redis-server` a link to it; the
  binary picks its mode from the name it is run by, so it is packed under the server's name);
- `lib/`: every shared library it loads that is not glibc's own (`ldd`: liblzf, libjemalloc, libatomic, and
  libsystemd, libssl/libcrypto, libstdc++, ... with what they load in turn). A minimal image lacks the first
  three; the rest usually exist but in other versions, so all of them travel: the set is what this binary was
  linked and tested against, and only the glibc of the target is used (it needs GLIBC_2.34 at most here;
  the GPU machine has 2.39);
- `redis-server`: a wrapper that runs the binary with `lib/` first on `LD_LIBRARY_PATH` (through `exec`, so
  the process id a caller holds is the server's). `scripts/gpu/redis_site.sh` unpacks it there and exports
  `FLEETGATE_REDIS_SERVER` (read by `fleetgate.bench.live_replicas`).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/gpu/pack_redis.py [--binary /usr/bin/redis-server] [--out PATH]
"""

from __future__ import annotations

import argparse
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# glibc's own libraries: the target's must be used (they go with its loader), so they are never packed
GLIBC = ("linux-vdso.so", "ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so",
         "libresolv.so", "libutil.so", "libmvec.so")
LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
WRAPPER = """#!/bin/sh
# redis-server with the libraries packed beside it first on the path (scripts/gpu/pack_redis.py)
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/redis-server" "$@"
"""


def is_glibc(soname: str) -> bool:
    return soname.startswith(GLIBC)


def libraries(binary: Path) -> dict[str, Path]:
    """The shared libraries `binary` loads, all the way down (`ldd`), that are not glibc's: soname -> file."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found: dict[str, Path] = {}
    for line in out.splitlines():
        m = LDD_LINE.match(line)
        if m is None:
            if "not found" in line:
                raise RuntimeError(f"{binary}: a library is missing here: {line.strip()}")
            continue
        soname, path = m.groups()
        if not is_glibc(soname):
            found[soname] = Path(path)
    return found


def pack(binary: Path, out: Path) -> dict[str, int]:
    """Write the archive; returns the packed files' sizes (bytes) by name in the folder."""
    real = binary.resolve()
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="pack-redis-") as tmp:
        root = Path(tmp) / "redis"
        (root / "bin").mkdir(parents=True)
        (root / "lib").mkdir()
        shutil.copy2(real, root / "bin" / "redis-server")
        sizes["bin/redis-server"] = real.stat().st_size
        for soname, path in sorted(libraries(real).items()):
            shutil.copyfile(path.resolve(), root / "lib" / soname)  # the file itself, under the name asked for
            sizes[f"lib/{soname}"] = path.resolve().stat().st_size
        wrapper = root / "redis-server"
        wrapper.write_text(WRAPPER, encoding="utf-8")
        wrapper.chmod(0o755)
        (root / "bin" / "redis-server").chmod(0o755)
        out.parent.mkdir(parents=True, exist_ok=True)
        with lzma.open(out, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
            tar.add(root, arcname="redis")
    return sizes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, default=Path(shutil.which("redis-server") or "/usr/bin/redis-server"))
    parser.add_argument("--out", type=Path, default=Path("build/gpu/redis.tar.xz"))
    args = parser.parse_args(argv)
    if not args.binary.exists():
        print(f"no redis-server at {args.binary}: `apt-get install redis-server` here first", file=sys.stderr)
        return 2
    sizes = pack(args.binary, args.out)
    for name, size in sizes.items():
        print(f"  {name} ({size // 1024} KiB)")
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB, {len(sizes) - 1} libraries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
