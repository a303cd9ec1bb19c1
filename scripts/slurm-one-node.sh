#!/bin/bash
# A one-machine Slurm cluster for tests: munge, slurmctld and slurmd on this
# host (Debian's slurm-wlm and munge), as root. Usage:
#   scripts/slurm-one-node.sh start   # writes /etc/slurm/slurm.conf, starts the daemons, waits for the node
#   scripts/slurm-one-node.sh stop
# Then: srun -N1 hostname; gyre train --tiny --cluster slurm
set -euo pipefail
STATE=${GYRE_SLURM_STATE:-/var/tmp/gyre-slurm}
HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(awk '/MemTotal/ {print int($2/1024) - 512}' /proc/meminfo)

start() {
  command -v slurmctld >/dev/null || { echo "install slurm-wlm and munge first (apt-get install -y slurm-wlm munge)" >&2; exit 2; }
  mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /etc/munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || munged --force
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=gyre
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 1 50); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      sinfo; return 0
    fi
    sleep 0.2
  done
  echo "the node did not come up; logs in $STATE/log" >&2
  sinfo -R >&2 || true
  exit 1
}

stop() {
  # Only the daemons this script started, by their pid files.
  for d in slurmd slurmctld; do
    if [ -s "$STATE/$d.pid" ]; then kill "$(cat "$STATE/$d.pid")" 2>/dev/null || true; fi
  done
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
