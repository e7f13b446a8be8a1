#!/usr/bin/env bash
# Hand-run proof of kit's CPU recipe: two "nodes" (containers with fixed IPs on a private
# Docker network) serve kit/tiny-llama with vLLM's multi-node backend (TP=2 across them),
# then the same two containers form a Ray cluster. Prints timings; cleans up after itself
# (images are kept). This is the recipe kit's integration tests automate.
#
# Usage: cpu-2node-smoke.sh [IMAGE]        (default kit/vllm-cpu:test)
# Env:   KIT_SMOKE_CACHE  host dir for the generated HF cache (default /tmp/kit-smoke-hf)
#        KIT_SMOKE_SUBNET (default 172.31.250.0/24; nodes .10 and .11)
#        KIT_SMOKE_TIMEOUT seconds to wait for /health (default 300)
set -euo pipefail

IMAGE="${1:-kit/vllm-cpu:test}"
CACHE="${KIT_SMOKE_CACHE:-/tmp/kit-smoke-hf}"
SUBNET="${KIT_SMOKE_SUBNET:-172.31.250.0/24}"
TIMEOUT="${KIT_SMOKE_TIMEOUT:-300}"
NET=kitproof
PREFIX="${SUBNET%.*}"
HEAD_IP="$PREFIX.10"
WORKER_IP="$PREFIX.11"
LABEL=kit.test=cpu-2node-smoke

log() { printf '[smoke %4ss] %s\n' "$SECONDS" "$*" >&2; }

cleanup() {
    local ids
    ids="$(docker ps -aq --filter "label=$LABEL")"
    if [ -n "$ids" ]; then
        # shellcheck disable=SC2086  # ids is a whitespace-separated list
        docker rm -f $ids >/dev/null
    fi
    docker network rm "$NET" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup

# 1. The model, generated offline inside the image into a host directory.
t=$SECONDS
docker run --rm --label "$LABEL" -v "$CACHE:/hf-cache" "$IMAGE" \
    python3 /opt/kit/make_tiny_model.py --out /hf-cache/hub
log "model generated in $((SECONDS - t))s"

docker network create --label "$LABEL" --subnet "$SUBNET" "$NET" >/dev/null

# 2. vLLM multi-node backend, TP=2 over two containers.
node() {  # node NAME IP RANK [extra vllm args...]
    local name=$1 ip=$2 rank=$3
    shift 3
    docker run -d --name "$name" --label "$LABEL" --network "$NET" --ip "$ip" \
        --shm-size 2g -v "$CACHE:/hf-cache:ro" \
        -e HF_HOME=/hf-cache -e HF_HUB_OFFLINE=1 \
        -e VLLM_HOST_IP="$ip" -e GLOO_SOCKET_IFNAME=eth0 \
        -e VLLM_CPU_KVCACHE_SPACE=1 \
        "$IMAGE" \
        vllm serve kit/tiny-llama --tensor-parallel-size 2 --nnodes 2 --node-rank "$rank" \
        --master-addr "$HEAD_IP" --enforce-eager "$@" >/dev/null
}
t=$SECONDS
node kit-smoke-0 "$HEAD_IP" 0
node kit-smoke-1 "$WORKER_IP" 1 --headless

probe() {  # probe URL [JSON body]: HTTP from inside the head container (python, no curl)
    docker exec kit-smoke-0 python3 -c '
import json, sys, urllib.request
url, body = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
req = urllib.request.Request(url, data=body.encode() if body else None,
                             headers={"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=60).read().decode())
' "$@"
}

until probe "http://$HEAD_IP:8000/health" >/dev/null 2>&1; do
    for c in kit-smoke-0 kit-smoke-1; do
        if [ "$(docker inspect -f '{{.State.Running}}' "$c")" != true ]; then
            docker logs --tail 40 "$c" >&2
            log "FAIL: $c exited"
            exit 1
        fi
    done
    if [ $((SECONDS - t)) -ge "$TIMEOUT" ]; then
        docker logs --tail 40 kit-smoke-0 >&2
        log "FAIL: not healthy after ${TIMEOUT}s"
        exit 1
    fi
    sleep 2
done
log "TP=2 over 2 nodes ready in $((SECONDS - t))s"
probe "http://$HEAD_IP:8000/v1/models"
probe "http://$HEAD_IP:8000/v1/chat/completions" \
    '{"model": "kit/tiny-llama", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8, "temperature": 0}'
docker rm -f kit-smoke-0 kit-smoke-1 >/dev/null

# 3. Ray between the same two "nodes". The object store must fit in /dev/shm (2g here),
# else Ray falls back to /tmp with a warning. GCS (ray.nodes()) sees the worker a few
# seconds before the autoscaler's `ray status` does: wait for both.
ray_node() {  # ray_node NAME IP ray-start-args...
    local name=$1 ip=$2
    shift 2
    docker run -d --name "$name" --label "$LABEL" --network "$NET" --ip "$ip" \
        --shm-size 2g -e VLLM_HOST_IP="$ip" -e RAY_USAGE_STATS_ENABLED=0 \
        "$IMAGE" ray start --block --node-ip-address "$ip" \
        --object-store-memory 1000000000 "$@" >/dev/null
}
t=$SECONDS
ray_node kit-ray-0 "$HEAD_IP" --head --port 6379 --include-dashboard=false
ray_node kit-ray-1 "$WORKER_IP" --address "$HEAD_IP:6379"
until [ "$(docker exec kit-ray-0 python3 -c '
import ray
ray.init(address="auto", logging_level="ERROR")
print(sum(1 for n in ray.nodes() if n["Alive"]))' 2>/dev/null)" = 2 ]; do
    if [ $((SECONDS - t)) -ge "$TIMEOUT" ]; then
        docker logs --tail 40 kit-ray-1 >&2
        log "FAIL: Ray cluster did not reach 2 nodes"
        exit 1
    fi
    sleep 1
done
log "Ray cluster with 2 alive nodes (GCS) after $((SECONDS - t))s"
until [ "$(docker exec kit-ray-0 ray status 2>/dev/null | sed -n '/^Active:/,/^Pending:/p' | grep -c node_)" = 2 ]; do
    if [ $((SECONDS - t)) -ge "$TIMEOUT" ]; then
        log "FAIL: ray status never showed 2 nodes"
        exit 1
    fi
    sleep 1
done
log "ray status shows 2 nodes after $((SECONDS - t))s"
docker exec kit-ray-0 ray status
docker exec kit-ray-0 python3 -c '
import ray
ray.init(address="auto", logging_level="ERROR")
print(sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]))'
log "OK"
