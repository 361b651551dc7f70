#!/bin/bash
# Run as root on the head: a read-only rsync daemon on its fabric address, open to the pulling
# workers only and only until they are done; each worker (reached through the SSH mesh) runs the
# pull command at the same time, the snapshot's manifest on its stdin (it waits for the daemon's
# port itself: the SSH handshakes and the daemon's start overlap).
#
#   stage_head.sh REPO MANIFEST BIND_IP PORT PULL WORKER_IP...
#
#   REPO       the repository's folder in the HF cache; the daemon serves its parent folder
#   MANIFEST   the manifest's file name in REPO
#   BIND_IP    the head's fabric address; PORT: the daemon's port
#   PULL       the command each worker runs (stage_pull.py through sudo, see transfer.py)
#   WORKER_IP  the fabric address of each worker whose copy differs
set -u
repo=${1%/}; manifest=$2; bind_ip=$3; port=$4; pull=$5; shift 5
run=$(mktemp -d /run/sparkinfra-stage.XXXXXX)
# uid root: huggingface_hub writes some cache files 0600 (trees/<rev>.json); still read-only,
# and open only to the workers' fabric addresses for the transfer's duration.
cat > "$run/rsyncd.conf" <<CONF
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
hosts allow = $*
hosts deny = *
CONF
rsync --daemon --no-detach --config="$run/rsyncd.conf" & daemon=$!
# KILL: on TERM rsync's daemon lingers ~0.4 s; it serves nothing once every pull is done.
trap 'kill -KILL $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run"' EXIT
rc=0; pids=
for ip in "$@"; do
    ssh -o BatchMode=yes -o Compression=no "$ip" "$pull" < "$repo/$manifest" & pids="$pids $!"
done
for p in $pids; do wait "$p" || rc=1; done
exit $rc
