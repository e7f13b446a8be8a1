#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine; idempotent.
#
# Used by .ci/run on a fresh Debian machine (FIELD_NOTES section 7): if `docker info`
# already works, do nothing. Otherwise install docker.io when dockerd is missing,
# start dockerd in the background (log in $KIT_DOCKERD_LOG) and wait for its socket.
#
# Env: KIT_DOCKERD_LOG (default /var/log/kit-dockerd.log),
#      KIT_DOCKERD_TIMEOUT seconds to wait for the engine (default 60),
#      KIT_DOCKER_SOCKET (default /var/run/docker.sock).
set -euo pipefail

LOG="${KIT_DOCKERD_LOG:-/var/log/kit-dockerd.log}"
TIMEOUT="${KIT_DOCKERD_TIMEOUT:-60}"
SOCKET="${KIT_DOCKER_SOCKET:-/var/run/docker.sock}"

log() { printf '[docker-engine] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if docker info >/dev/null 2>&1; then
    log "engine already up: $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "docker info fails and starting dockerd needs root"
    SUDO=(sudo)
fi

if ! command -v dockerd >/dev/null 2>&1; then
    log "dockerd missing: installing docker.io"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq docker.io >/dev/null
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after installing docker.io"

"${SUDO[@]}" mkdir -p "$(dirname "$LOG")"
"${SUDO[@]}" touch "$LOG"

# Show only what this start wrote to the log: lines from an earlier engine would mislead.
log_from=1
new_log() { tail -n "+$log_from" "$LOG" 2>/dev/null | tail -n 20 >&2 || true; }

started=""
start_engine() {
    # A stale socket or pid file from a killed engine makes the new one refuse to start.
    if [ -S "$SOCKET" ]; then "${SUDO[@]}" rm -f "$SOCKET"; fi
    "${SUDO[@]}" rm -f /var/run/docker.pid
    log_from=$(($(wc -l <"$LOG") + 1))
    log "starting dockerd (log: $LOG)"
    # setsid: the engine must outlive this script and the CI step's shell. --wait keeps the
    # background job's pid alive exactly as long as dockerd, so that pid is what we watch.
    # --max-download-attempts 1: a layer download that fails is not retried (the default retries
    # 5 times, 5 to 25 s apart: 75 s of CI time for the registry-gone test, whose subject is what
    # kit says once the engine gives up; the registries here are local).
    "${SUDO[@]}" setsid --wait nohup dockerd --max-download-attempts 1 >>"$LOG" 2>&1 </dev/null &
    started=$!
}
alive() {
    if [ -n "$started" ]; then kill -0 "$started" 2>/dev/null; else pgrep -x dockerd >/dev/null 2>&1; fi
}

if pgrep -x dockerd >/dev/null 2>&1; then
    # Started (by us or someone else) but not answering yet: wait for it, do not start a second.
    log "dockerd is running but not answering yet; waiting"
else
    start_engine
fi

# An engine that dies while starting is started again (twice at most): on a shared CI host
# a stray cleanup of an earlier job's processes has killed a fresh dockerd before it wrote
# a single line. A real failure writes its reason, shown with the error.
retries=2
deadline=$((SECONDS + TIMEOUT))
until [ -S "$SOCKET" ] && docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "what dockerd wrote to $LOG:"
        new_log
        die "Docker engine not ready after ${TIMEOUT}s (socket $SOCKET); see $LOG"
    fi
    if ! alive; then
        log "dockerd exited during start-up; what it wrote to $LOG:"
        new_log
        if [ "$retries" -eq 0 ] || pgrep -x dockerd >/dev/null 2>&1; then
            die "dockerd exited during start-up; see $LOG"
        fi
        retries=$((retries - 1))
        sleep 2
        start_engine
    fi
    sleep 1
done
log "engine up after $((TIMEOUT - (deadline - SECONDS)))s: $(docker version --format '{{.Server.Version}}')"
