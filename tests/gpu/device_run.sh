#!/usr/bin/env bash
# One batched run on the 2x H200 device machine (see the `run` tool); writes into $OUT:
# verify_{p2p,shm,socket}.json, verify_socket_nvlink.json, bench.json, device.log.
set -u
export PYTHONPATH="$PWD/.devdeps:$PWD" PYTHONUNBUFFERED=1
log="$OUT/device.log"
{
  nvidia-smi -L; nvidia-smi topo -m
  python3 -c 'import sys, torch; print(sys.version); print(torch.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())'
  python3 -c 'import click, yaml, jinja2; print("deps ok")'
  env | grep -E '^(NCCL|TORCH|NVSHMEM)_' || true
} >"$log" 2>&1
run() {  # name, env..., -- args...
  local name=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$(date +%s%N)
  env "${envs[@]}" python3 -m kit verify --host --json "$@" >"$OUT/verify_$name.json" 2>>"$log"
  local rc=$?
  echo "verify_$name rc=$rc wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))" | tee -a "$log"
}
run p2p KIT_X=1 --
run shm NCCL_P2P_DISABLE=1 --
run socket NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 --
run socket_nvlink NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 -- --expect nvlink --sizes 32M
python3 -m kit verify --host 2>&1 | tee -a "$log"
python3 benchmarks/verify_bandwidth.py --out "$OUT/bench.json" --skip-verify 2>&1 | tee -a "$log"
if python3 -c 'import pytest' 2>/dev/null; then
  python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tail -15 | tee -a "$log"
fi
