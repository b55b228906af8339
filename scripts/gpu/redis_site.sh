#!/usr/bin/env bash
# On the GPU machine: unpack the redis-server packed by scripts/gpu/pack_redis.py (with the libraries it loads)
# once per machine, and export FLEETGATE_REDIS_SERVER (its wrapper, which puts those libraries first on
# LD_LIBRARY_PATH for redis alone) for `scripts/gpu_routing_run.py --gateway-replicas N`.
# Usage (from the repository root there): source scripts/gpu/redis_site.sh
#   the archive is taken from build/gpu/ when this run carried it, else from /root/stage/ (an earlier run's
#   `mkdir -p /root/stage && cp build/gpu/redis.tar.xz /root/stage/`).
# A rehearsal elsewhere: REDIS_ROOT (where to unpack), REDIS_BUILD (the carried folder), REDIS_STAGE (the staged one).
redis_root=${REDIS_ROOT:-/root/redis}
redis_src=${REDIS_BUILD:-build/gpu}/redis.tar.xz
[ -f "$redis_src" ] || redis_src=${REDIS_STAGE:-/root/stage}/redis.tar.xz
if [ ! -f "$redis_root/.complete" ]; then
  [ -f "$redis_src" ] || { echo "redis: redis.tar.xz is neither carried nor staged"; return 3 2>/dev/null || exit 3; }
  mkdir -p "$redis_root" && rm -rf "$redis_root/redis" && tar -xJf "$redis_src" -C "$redis_root" \
    || { echo "redis: unpacking $redis_src failed"; return 4 2>/dev/null || exit 4; }
  touch "$redis_root/.complete"
fi
export FLEETGATE_REDIS_SERVER=$redis_root/redis/redis-server
"$FLEETGATE_REDIS_SERVER" --version || { echo "redis: $FLEETGATE_REDIS_SERVER does not run"; return 5 2>/dev/null || exit 5; }
