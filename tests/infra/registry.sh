#!/usr/bin/env bash
# Make sure Debian's Docker registry (distribution 2.x, package docker-registry) is installed;
# idempotent. Prints the binary's path. With `serve PORT DIR`, also runs a throwaway registry
# on 127.0.0.1:PORT storing into DIR, in the foreground (Ctrl-C stops it).
#
# The integration tests (tests/integration/test_registry.py) start the binary themselves; this
# script is for CI machines and for trying the registry by hand. The engine treats registries
# on 127.0.0.0/8 as insecure (plain HTTP) by default, so no TLS is needed on loopback.
#
# Env: KIT_REGISTRY_BIN (default /usr/bin/docker-registry)
set -euo pipefail

BIN="${KIT_REGISTRY_BIN:-/usr/bin/docker-registry}"

log() { printf '[registry] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [ ! -x "$BIN" ]; then
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "$BIN is missing and installing it needs root"
        SUDO=(sudo)
    fi
    log "installing docker-registry"
    "${SUDO[@]}" apt-get update -qq
    # The package's postinst may try to start a service; there is no init here, which is fine.
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
    [ -x "$BIN" ] || die "$BIN still missing after installing docker-registry"
fi
echo "$BIN"

if [ "${1:-}" = serve ]; then
    PORT="${2:?usage: registry.sh serve PORT DIR}"
    DIR="${3:?usage: registry.sh serve PORT DIR}"
    mkdir -p "$DIR"
    CONFIG="$DIR/config.yml"
    cat >"$CONFIG" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/data
http:
  addr: 127.0.0.1:$PORT
YAML
    log "serving on 127.0.0.1:$PORT (storage $DIR/data)"
    exec "$BIN" serve "$CONFIG"
fi
