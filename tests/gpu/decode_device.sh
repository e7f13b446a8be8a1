#!/usr/bin/env bash
# The one run behind tests/fixtures/recorded/decode/ (issue 30), on a device machine with 2+ GPUs
# (the `run` tool, kind nvidia-h100-x2 or nvidia-h200-x2), from the repository root:
#
#   bash tests/gpu/decode_device.sh NCCL_TESTS_BIN [ROUNDS]
#
# NCCL_TESTS_BIN: a folder with an all_reduce_perf built against the NCCL that torch uses
# (nccl-tests is not part of kit and is not built here; its banner is checked by the benchmark).
# It runs the binary with torch's own libnccl first on LD_LIBRARY_PATH, so both sides use one
# NCCL. Writes into $OUT: device.log (environment, every command and its exit code),
# bench.txt / bench.json (benchmarks/verify_bandwidth.py: nccl-tests and kit side by side,
# alternating rounds), raw.tgz (every raw output: nccl-tests stdout, the probe's JSON, the text
# and JSON of `kit verify --host`). NCCL_NVLS_ENABLE and the like stay as the machine sets them.
set -u
bin=$(cd "$1" && pwd) rounds=${2:-3}
out=${OUT:?set OUT to the folder for the results}
raw="$out/raw" log="$out/device.log"
mkdir -p "$raw"
export PYTHONUNBUFFERED=1
nccl_lib=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))')
export LD_LIBRARY_PATH="$nccl_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step() {  # name, command...: run it, log the command, its exit code and its wall time
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  echo "### $name: $*" >>"$log"
  "$@"
  local rc=$?
  echo "### $name: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" >>"$log"
}
{
  date -u +%Y-%m-%dT%H:%M:%SZ; uname -a; nvidia-smi; nvidia-smi topo -m; nvidia-smi -L
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version --format=csv
  python3 -c 'import sys, torch; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.nccl.version())'
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl|click|pyyaml|jinja2|requests|docker|spython) '
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$bin/all_reduce_perf" | grep -E 'nccl|cudart'
  env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)_' | sort
  echo "kit commit ${KIT_COMMIT:-$(git log -1 --format=%H 2>/dev/null)}"
} >"$log" 2>&1
# shellcheck disable=SC2129  # one redirect per step keeps each step's output apart
step bench python3 benchmarks/verify_bandwidth.py --nccl-tests "$bin" --rounds "$rounds" --raw "$raw" \
  --out "$out/bench.json" >"$out/bench.txt" 2>>"$log"
step verify_text python3 -m kit verify --host >"$raw/kit_verify_host.txt" 2>>"$log"
step verify_auto_json python3 -m kit verify --host --json --sizes 1M,32M,1G >"$raw/kit_verify_host_auto.json" 2>>"$log"
step verify_socket_json env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 python3 -m kit verify --host --json \
  --expect socket-ok --sizes 32M >"$raw/kit_verify_host_socket.json" 2>>"$log"
if python3 -c 'import pytest' 2>/dev/null; then
  step pytest_gpu python3 -m pytest tests/gpu -q -p no:cacheprovider >"$raw/pytest_gpu.txt" 2>&1
fi
tar -C "$out" -czf "$out/raw.tgz" raw && rm -rf "$raw"
cat "$out/bench.txt"
