"""`scripts/gpu/pack_redis.py` and `scripts/gpu/redis_site.sh`: this machine's redis-server packed with every
non-glibc library it loads, unpacked by the loader into a fresh folder, run through the exported wrapper.

The GPU machine has no redis-server and may lack liblzf/libjemalloc/libatomic: the loader's wrapper must find every
library it needs in the pack alone. The dynamic loader is asked, with its cache off and only the pack on its path,
where each library comes from: all but glibc's must come from the pack."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgate.core.localredis import LocalRedis

ROOT = Path(__file__).resolve().parents[2]
LOADER = Path("/lib64/ld-linux-x86-64.so.2")

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    work = tmp_path_factory.mktemp("redis-pack")
    build = work / "build"
    subprocess.run([sys.executable, str(ROOT / "scripts/gpu/pack_redis.py"), "--out", str(build / "redis.tar.xz")],
                   check=True, capture_output=True, timeout=120)
    root = work / "root"
    script = f'REDIS_ROOT={root} REDIS_BUILD={build} REDIS_STAGE={work}/none; source ' \
             f'{ROOT}/scripts/gpu/redis_site.sh && echo "server=$FLEETGATE_REDIS_SERVER"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Redis server v=" in out.stdout  # the loader ran the wrapper once
    assert f"server={root}/redis/redis-server" in out.stdout
    return root / "redis"


def test_the_pack_holds_every_non_glibc_library_the_server_loads(unpacked: Path) -> None:
    if not LOADER.exists():
        pytest.skip(f"no {LOADER} to ask")
    lib = unpacked / "lib"
    for needed in ("liblzf.so.1", "libjemalloc.so.2", "libatomic.so.1"):  # what a minimal image lacks
        assert (lib / needed).is_file()
    listing = subprocess.run([str(LOADER), "--inhibit-cache", "--library-path", str(lib), "--list",
                              str(unpacked / "bin/redis-server")], capture_output=True, text=True, check=True).stdout
    resolved = dict(line.strip().split(" => ", 1) for line in listing.splitlines() if " => " in line)
    assert resolved and "not found" not in listing
    glibc = {name for name in resolved if name.startswith(("libc.so", "libm.so"))}
    outside = {name: where for name, where in resolved.items() if name not in glibc and not where.startswith(str(lib))}
    assert not outside, outside


def test_the_wrapper_runs_a_server_as_the_process_it_started(unpacked: Path) -> None:
    wrapper = unpacked / "redis-server"
    with LocalRedis(binary=str(wrapper)) as redis:
        with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
            s.sendall(b"SET k v\r\nGET k\r\n")
            assert s.recv(64).startswith(b"+OK\r\n")
        pid = redis.pid
        assert pid is not None
        # exec: the pid the harness holds is the server itself, so stopping it stops redis (no orphan)
        assert Path(os.readlink(f"/proc/{pid}/exe")) == unpacked / "bin/redis-server"
        # the running server loaded the packed libraries, not the machine's (redis overwrites its environ area
        # with its process title, so its memory map is what tells)
        maps = Path(f"/proc/{pid}/maps").read_text()
        for name in ("libjemalloc.so.2", "liblzf.so.1", "libssl.so.3"):
            assert f"{unpacked}/lib/{name}" in maps and f"/x86_64-linux-gnu/{name}" not in maps, name
    assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()
