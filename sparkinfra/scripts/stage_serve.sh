#!/bin/bash
# Run as root on the head: serve a snapshot's folder read-only to the pulling workers, from a
# transient unit (UNIT) running rsync's daemon on the head's fabric address. The workers pull
# from it next (each over its own pyinfra connection); the operation after theirs stops the unit.
#
#   stage_serve.sh UNIT CONF REPO BIND_IP PORT WORKER_IP...
#
#   UNIT       the transient unit's name (sparkinfra-stage.service): a run that died left it
#              running at most RuntimeMaxSec; this run's is stopped and started afresh
#   CONF       the daemon's config file (written here, removed when the unit stops)
#   REPO       the repository's folder in the HF cache; the daemon serves its parent folder
#   BIND_IP    the head's fabric address; PORT: the daemon's port
#   WORKER_IP  the fabric address of each worker whose copy differs: the only hosts allowed
set -eu
unit=$1; conf=$2; repo=${3%/}; bind_ip=$4; port=$5; shift 5
hosts=$*
install -d -m 700 "${conf%/*}"
# uid root: huggingface_hub writes some cache files 0600 (trees/<rev>.json); still read-only,
# and open only to the workers' fabric addresses for the transfer's duration.
configure() {
    cat > "$conf" <<CONF
address = $bind_ip
port = $port
use chroot = no
numeric ids = yes
reverse lookup = no
socket options = TCP_NODELAY
[stage]
path = ${repo%/*}
read only = yes
uid = root
gid = root
hosts allow = $hosts
hosts deny = *
CONF
}
# KILL: on TERM rsync's daemon lingers ~0.4 s; it serves nothing once every pull is done. The deploy
# kills it (systemctl kill, no stop job to wait for): a success (SuccessExitStatus), not a failure.
# RuntimeMaxSec: a controller that died between the start and the stop leaves it up 6 h at most.
# --no-block: no wait for the start job (~15 ms); the pulls wait for the port. The unit's name is
# taken (a dead run's unit) only when the start fails: then it is stopped (its ExecStopPost removes
# the config) and this run's config written and started again.
serve() {
    configure
    systemd-run --no-block --quiet --collect --unit="$unit" --description="sparkinfra: the head serves a snapshot to the workers" \
        --property=KillSignal=SIGKILL --property=SuccessExitStatus=SIGKILL --property=RuntimeMaxSec=6h --property=ExecStopPost="/bin/rm -f $conf" \
        rsync --daemon --no-detach --config="$conf"
}
serve 2>/dev/null || { systemctl stop "$unit"; serve; }
