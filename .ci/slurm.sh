#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the `msb submit` tests (tests/study/test_slurm.py): Debian's
# slurm-wlm (slurmctld + slurmd) and munge, no systemd needed, no cgroups (proctrack/linuxproc, task/none).
# Usage: .ci/slurm.sh   (as root or with sudo; idempotent: a cluster that already answers is left alone)
# Files: /etc/slurm/slurm.conf (only written when absent or written by this script), state and logs under
# /var/spool/msb-slurm. The node is this host (`hostname -s`) on 127.0.0.1 with 2 CPUs, partition `debug`.
set -euo pipefail
sudo_=""
if [ "$(id -u)" != 0 ]; then sudo_="sudo"; fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq slurm-wlm munge >/dev/null
fi

node=$(hostname -s)
spool=/var/spool/msb-slurm
conf=/etc/slurm/slurm.conf
marker="# written by msb .ci/slurm.sh"
if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
  echo "slurm.sh: $conf exists and was not written by this script; using it as it is" >&2
else
  mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)  # half the RAM, in MB
  $sudo_ mkdir -p /etc/slurm "$spool/ctld" "$spool/d"
  $sudo_ tee "$conf" >/dev/null <<CONF
$marker
ClusterName=msbci
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/d
SlurmctldPidFile=$spool/slurmctld.pid
SlurmdPidFile=$spool/slurmd.pid
SlurmctldLogFile=$spool/slurmctld.log
SlurmdLogFile=$spool/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=10
MinJobAge=300
SchedulerParameters=sched_interval=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
fi

# munge: a key (the package usually creates one), the daemon as user munge
if [ ! -s /etc/munge/munge.key ]; then
  $sudo_ sh -c 'dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null'
  $sudo_ chown munge:munge /etc/munge/munge.key && $sudo_ chmod 400 /etc/munge/munge.key
fi
$sudo_ mkdir -p /run/munge && $sudo_ chown munge:munge /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then runuser -u munge -- /usr/sbin/munged; else sudo -u munge /usr/sbin/munged; fi
fi

pgrep -x slurmctld >/dev/null || $sudo_ /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || $sudo_ /usr/sbin/slurmd

for _ in $(seq 60); do
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mixed|allocated) echo "slurm: node $node is $state (partition debug)"; exit 0 ;;
    down*|drain*) $sudo_ scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 1
done
echo "slurm.sh: the node did not become idle within 60 s (sinfo: ${state:-no answer}); logs in $spool" >&2
exit 1
