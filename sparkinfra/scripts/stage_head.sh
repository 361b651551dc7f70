#!/bin/bash
# Run as root on the head: a read-only rsync daemon on its fabric address, open to the pulling
# workers only and only until they are done; each worker (reached through the SSH mesh) runs the
# pull command at the same time.
#
#   stage_head.sh REPO BIND_IP PORT PULL WORKER_IP...
#
#   REPO       the repository's folder in the HF cache; the daemon serves its parent folder
#   BIND_IP    the head's fabric address; PORT: the daemon's port
#   PULL       the command each worker runs (stage_pull.sh through sudo, see transfer.py)
#   WORKER_IP  the fabric address of each worker whose copy differs
set -u
repo=${1%/}; bind_ip=$2; port=$3; pull=$4; shift 4
run=$(mktemp -d /run/sparkinfra-stage.XXXXXX)
# uid root: huggingface_hub writes some cache files 0600 (trees/<rev>.json); still read-only,
# and open only to the workers' fabric addresses for the transfer's duration.
cat > "$run/rsyncd.conf" <<CONF
address = $bind_ip
port = $port
use chroot = no
numeric ids = yes
reverse lookup = no
[stage]
path = ${repo%/*}
read only = yes
uid = root
gid = root
hosts allow = $*
hosts deny = *
CONF
rsync --daemon --no-detach --config="$run/rsyncd.conf" & daemon=$!
# KILL: on TERM rsync's daemon lingers ~0.4 s; it serves nothing once every pull is done.
trap 'kill -KILL $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run"' EXIT
for _ in $(seq 50); do (exec 3<>"/dev/tcp/$bind_ip/$port") 2>/dev/null && break; sleep 0.1; done
rc=0; pids=
for ip in "$@"; do
    ssh -o BatchMode=yes -o Compression=no "$ip" "$pull" & pids="$pids $!"
done
for p in $pids; do wait "$p" || rc=1; done
exit $rc
