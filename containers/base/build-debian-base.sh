#!/usr/bin/env bash
# Build kit's Debian base image from scratch with debootstrap + `docker import`.
#
# No image registry is reachable on kit's build/test machines, so every base
# image is made locally (FIELD_NOTES section 7). The image is cached by tag:
# if it already exists the script does nothing unless --force is given.
#
# Usage: build-debian-base.sh [--force] [--mirror URL] [TAG]
#   TAG     image tag (default: $KIT_BASE_IMAGE or kit/debian-base:bookworm)
#   --mirror  Debian mirror (default: $KIT_DEBIAN_MIRROR, else the first
#             bookworm mirror in the host's apt sources, else deb.debian.org)
# Env: KIT_BASE_IMAGE, KIT_DEBIAN_MIRROR, KIT_DEBIAN_SUITE (default bookworm),
#      KIT_DEBIAN_EXTRA_INCLUDE  comma-separated extra packages (e.g. libnuma1 for
#      air-gapped CPU-image builds, which then need no apt at image build time).
set -euo pipefail

SUITE="${KIT_DEBIAN_SUITE:-bookworm}"
TAG="${KIT_BASE_IMAGE:-kit/debian-base:${SUITE}}"
MIRROR="${KIT_DEBIAN_MIRROR:-}"
FORCE=0
INCLUDE="python3,python3-venv,python3-pip,ca-certificates,iproute2,procps"
INCLUDE="$INCLUDE${KIT_DEBIAN_EXTRA_INCLUDE:+,$KIT_DEBIAN_EXTRA_INCLUDE}"
FALLBACK_MIRROR="http://deb.debian.org/debian"

log() { printf '[build-debian-base] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --force) FORCE=1 ;;
        --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; MIRROR="$2"; shift ;;
        --mirror=*) MIRROR="${1#--mirror=}" ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) die "unknown option: $1" ;;
        *) TAG="$1" ;;
    esac
    shift
done

# First "deb" URI from apt's sources whose suites include $SUITE itself
# (not -security/-updates). Reads deb822 *.sources and one-line *.list files.
host_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: paragraphs separated by blank lines; fields Types/URIs/Suites.
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uris != "" && enabled != "no") {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[[:space:]]*$/ { flush(); next }
            /^#/ { next }
            tolower($1) == "types:" { $1 = ""; types = $0 }
            tolower($1) == "uris:" { $1 = ""; uris = $0; sub(/^ +/, "", uris) }
            tolower($1) == "suites:" { $1 = ""; suites = $0; sub(/^ +/, "", suites) }
            tolower($1) == "enabled:" { enabled = tolower($2) }
            END { if (!found) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [opts] URI SUITE COMPONENTS...
        awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }
        ' "$f"
    done
}

if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    log "$TAG already exists (use --force to rebuild)"
    exit 0
fi

if [ -z "$MIRROR" ]; then
    MIRROR="$(host_mirror | head -n 1)"
    MIRROR="${MIRROR:-$FALLBACK_MIRROR}"
fi
log "tag=$TAG suite=$SUITE mirror=$MIRROR include=$INCLUDE"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "debootstrap needs root (run as root or install sudo)"
    SUDO=(sudo)
fi

if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
    log "installing debootstrap"
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq debootstrap
fi
DEBOOTSTRAP="$(command -v debootstrap || echo /usr/sbin/debootstrap)"

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/kit-debian-base.XXXXXX")"
cleanup() { "${SUDO[@]}" rm -rf "$ROOTFS"; }
trap cleanup EXIT

start=$SECONDS
"${SUDO[@]}" "$DEBOOTSTRAP" --variant=minbase --include="$INCLUDE" \
    "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2
    die "debootstrap failed (full log: $ROOTFS.log)"
}
log "debootstrap took $((SECONDS - start))s"

# Smaller image: apt lists and caches are re-fetched by any later apt-get update.
"${SUDO[@]}" rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

t_import=$SECONDS
"${SUDO[@]}" tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "kit debian base: debootstrap $SUITE minbase from $MIRROR" \
    - "$TAG" >/dev/null
log "docker import took $((SECONDS - t_import))s; total $((SECONDS - start))s"
rm -f "$ROOTFS.log"
docker image inspect --format '{{.Id}} {{.Size}}' "$TAG"
