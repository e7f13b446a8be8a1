#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for kit's SLURM tests; idempotent.
#
# Installs Debian's slurmctld/slurmd/slurm-client and munge (FIELD_NOTES section 7) when
# missing, writes /etc/slurm/slurm.conf (ClusterName kit, this host as the only node, CPUs
# from nproc, RealMemory below free memory, no GPUs), starts munged, slurmctld and slurmd in
# the background and waits until `sinfo` shows the node idle. State and logs live under
# $KIT_SLURM_DIR. If the node is already idle (or mixed/allocated), it does nothing.
#
# Env: KIT_SLURM_DIR   state/log dir (default /tmp/kit-slurm)
#      KIT_SLURM_TIMEOUT seconds to wait for the node (default 60)
# Needs root (or sudo) to install packages and start the daemons.
set -euo pipefail

DIR="${KIT_SLURM_DIR:-/tmp/kit-slurm}"
TIMEOUT="${KIT_SLURM_TIMEOUT:-60}"
CONF=/etc/slurm/slurm.conf
NODE="$(hostname -s)"

log() { printf '[slurm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

node_state() { sinfo -h -N -n "$NODE" -o %t 2>/dev/null | head -n 1 | tr -d '*'; }

if command -v sinfo >/dev/null 2>&1; then
    case "$(node_state)" in
        idle | mix | alloc) log "node $NODE already up ($(node_state))"; exit 0 ;;
    esac
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "starting SLURM needs root"
    SUDO=(sudo)
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
    || ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    log "installing slurmctld slurmd slurm-client munge"
    "${SUDO[@]}" apt-get update -qq
    # Package scripts may try to start the services; there is no init system to do it here.
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
fi

"${SUDO[@]}" mkdir -p "$DIR/state" "$DIR/spool" /etc/slurm /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating the munge key"
    "${SUDO[@]}" mkdir -p /etc/munge
    "${SUDO[@]}" dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
"${SUDO[@]}" chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
"${SUDO[@]}" chmod 0700 /etc/munge
"${SUDO[@]}" chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null 2>&1; then
    log "starting munged"
    "${SUDO[@]}" runuser -u munge -- munged
fi

cpus="$(nproc)"
# At least 4 CPUs, declared (SlurmdParameters=config_overrides: slurmd takes the configured count):
# the router test runs two replicas' array tasks and the router's job at once on this one node,
# and SLURM gives every job at least one CPU of its own.
(( cpus >= 4 )) || cpus=4
# RealMemory must not exceed what slurmd sees, or the node is drained: stay well below free.
free_mb="$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)"
mem_mb=$(( free_mb * 8 / 10 ))
[ "$mem_mb" -gt 256 ] || mem_mb=256

tmp_conf="$(mktemp)"
cat >"$tmp_conf" <<EOF
# Written by kit's tests/infra/slurm.sh: one node, no GPUs.
ClusterName=kit
SlurmctldHost=$NODE
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=10
NodeName=$NODE CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
"${SUDO[@]}" install -m 0644 "$tmp_conf" "$CONF"
rm -f "$tmp_conf"

if ! pgrep -x slurmctld >/dev/null 2>&1; then
    log "starting slurmctld (log: $DIR/slurmctld.log)"
    "${SUDO[@]}" setsid nohup slurmctld -i >>"$DIR/slurmctld.out" 2>&1 </dev/null &
fi
if ! pgrep -x slurmd >/dev/null 2>&1; then
    log "starting slurmd (log: $DIR/slurmd.log)"
    "${SUDO[@]}" setsid nohup slurmd >>"$DIR/slurmd.out" 2>&1 </dev/null &
fi

deadline=$(( SECONDS + TIMEOUT ))
while :; do
    state="$(node_state || true)"
    case "$state" in
        idle | mix | alloc) break ;;
        drain | drng | down)
            # A node drained by an earlier run (e.g. memory) comes back once the config fits.
            "${SUDO[@]}" scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 2>/dev/null || true
        die "node $NODE not idle after ${TIMEOUT}s (state: ${state:-none})"
    fi
    sleep 1
done
log "node $NODE is $(node_state); $(sinfo -V)"
