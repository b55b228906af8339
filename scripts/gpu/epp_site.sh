#!/usr/bin/env bash
# On the GPU machine: unpack what `fleetgate epp` and Envoy need (scripts/gpu/pack_epp.py) once per machine, then
# export EPP_SITE (the picker's site directory: pass `--epp-site "$EPP_SITE"` to scripts/gpu_routing_run.py) and put
# Envoy's binary on PATH.
# Usage (from the repository root there, after the kit's install.sh): source scripts/gpu/epp_site.sh
#   each archive is taken from build/gpu/ when this run carried it, else from /root/stage/ (an earlier run's
#   `mkdir -p /root/stage && cp build/gpu/envoy.xz build/gpu/epp-site.tar.xz /root/stage/`).
# A rehearsal elsewhere: EPP_ROOT (where to unpack), EPP_BUILD (the carried folder), EPP_STAGE (the staged one).
epp_root=${EPP_ROOT:-/root/epp}
epp_find() {
  local carried=${EPP_BUILD:-build/gpu}/$1 staged=${EPP_STAGE:-/root/stage}/$1
  if [ -f "$carried" ]; then echo "$carried"; elif [ -f "$staged" ]; then echo "$staged"; else return 1; fi
}
mkdir -p $epp_root/bin
if [ ! -f $epp_root/.site-complete ]; then
  src=$(epp_find epp-site.tar.xz) || { echo "epp: epp-site.tar.xz is neither carried nor staged"; return 3 2>/dev/null || exit 3; }
  rm -rf $epp_root/epp-site && tar -xJf "$src" -C $epp_root || { echo "epp: unpacking $src failed"; return 4 2>/dev/null || exit 4; }
  touch $epp_root/.site-complete
fi
if [ ! -x $epp_root/bin/envoy ]; then
  src=$(epp_find envoy.xz) || { echo "epp: envoy.xz is neither carried nor staged"; return 3 2>/dev/null || exit 3; }
  xz -dc "$src" > $epp_root/bin/envoy.part && chmod +x $epp_root/bin/envoy.part && mv $epp_root/bin/envoy.part $epp_root/bin/envoy \
    || { echo "epp: unpacking $src failed"; return 4 2>/dev/null || exit 4; }
fi
export EPP_SITE=$epp_root/epp-site PATH=$epp_root/bin:$PATH
echo "epp: $(envoy --version 2>&1 | grep -m1 -o "version: .*")"
PYTHONPATH=$EPP_SITE${PYTHONPATH:+:$PYTHONPATH} ${PYTHON:-python3} -c "import grpc, grpc_health, google.protobuf as p; from envoy.service.ext_proc.v3 import external_processor_pb2; print('epp: grpcio', grpc.__version__, 'protobuf', p.__version__)"
