#!/usr/bin/env bash
# A real single-node Slurm (munged, slurmctld, slurmd as root) whose config, state, logs and pid files all live in
# DIR; nothing in /etc/slurm is written. Clients and daemons find the config through SLURM_CONF.
#   bash .ci/slurm.sh up DIR     start (exits 0 at once if this DIR's cluster already answers)
#   bash .ci/slurm.sh down DIR   stop what `up` started (idempotent)
set -euo pipefail
cmd=${1:-}; dir=${2:-}
[[ ( $cmd == up || $cmd == down ) && -n $dir ]] || { echo "usage: $0 up|down DIR" >&2; exit 2; }
mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
export SLURM_CONF=$dir/slurm.conf
daemons=(slurmd slurmctld munged)   # stop order

# Alive and still that daemon (a stale pid file's number may have been reused).
alive() { [[ -f $dir/$1.pid && $(cat "/proc/$(cat "$dir/$1.pid")/comm" 2>/dev/null) == "$1" ]]; }

stop() {
    local d pid
    for d in "${daemons[@]}"; do
        alive "$d" || { rm -f "$dir/$d.pid"; continue; }
        pid=$(cat "$dir/$d.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$dir/$d.pid"
    done
}

if [[ $cmd == down ]]; then stop; exit 0; fi

if alive slurmctld && alive slurmd && [[ $(sinfo -h -o %t 2>/dev/null) =~ idle|mix|alloc ]]; then
    echo "slurm already up in $dir"; echo "export SLURM_CONF=$SLURM_CONF"; exit 0
fi
stop   # a half-started cluster from an earlier run
# Ports of its own, so that this cluster runs beside another one (a developer's, left up) on this machine.
listening() { (: >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=6817
while listening "$port" || listening $((port + 1)); do port=$((port + 2)); done

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)   # slurmd drains a node that has less than RealMemory
# Fresh state each time: old state is replayed on start, and state written under another ClusterName
# makes slurmctld refuse to start ("CLUSTER NAME MISMATCH").
rm -rf "$dir/state" "$dir/spool"; mkdir -p "$dir/state" "$dir/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=structbench
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
SelectType=select/cons_tres
# Memory is a consumable: a job's --mem is checked and reserved; one without it gets a per-CPU share, not the whole node.
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem / cpus))
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

start=$EPOCHREALTIME
# Reuse a munged that already answers on the default socket (and leave it running on `down`).
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [[ ! -f /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge; chown munge:munge /run/munge
    munged --force --pid-file="$dir/munged.pid" --log-file="$dir/munged.log"
fi
slurmctld
slurmd

for _ in $(seq 120); do
    if alive slurmctld && alive slurmd && [[ $(sinfo -h -o %t 2>/dev/null) =~ idle|mix|alloc ]]; then
        printf 'slurm up in %s: node %s idle after %.1f s\n' "$dir" "$host" "$(awk "BEGIN {print $EPOCHREALTIME - $start}")"
        echo "export SLURM_CONF=$SLURM_CONF" >"$dir/env.sh"; cat "$dir/env.sh"
        exit 0
    fi
    sleep 0.5
done
echo "slurm did not come up within 60 s; sinfo says: $(sinfo -h -o %t 2>&1)" >&2
for f in "$dir"/*.log; do echo "== $f" >&2; tail -n 30 "$f" >&2; done
stop; exit 1
