#!/bin/bash
# Run as root on the head: one docker save of IMAGE, teed to a docker load on each worker through
# the SSH mesh, all at once (the head reads and packs the image once, however many workers receive
# it); then each worker's image ID, checked against the head's. A worker that fails to load does
# not stop the others; it ends the script with an error naming both IDs.
#
#   image_fanout.sh IMAGE HEAD_ID NAME=IP...
set -u -o pipefail
image=$1; head_id=$2; shift 2
ssh_mesh=(ssh -o BatchMode=yes -o Compression=no)
rc=0; pids=; fifos=$(mktemp -d); trap 'rm -rf "$fifos"' EXIT
outputs=()
for worker in "$@"; do
    ip=${worker#*=}
    mkfifo "$fifos/$ip"
    "${ssh_mesh[@]}" "$ip" 'sudo -n docker load -q' < "$fifos/$ip" > /dev/null & pids="$pids $!"
    outputs+=("$fifos/$ip")
done
# -p: a worker whose load ends early does not cut the stream to the others.
docker save "$image" | tee -p "${outputs[@]}" > /dev/null || rc=1
for p in $pids; do wait "$p" || rc=1; done
for worker in "$@"; do
    name=${worker%%=*}; ip=${worker#*=}
    got=$("${ssh_mesh[@]}" "$ip" "sudo -n docker image inspect --format '{{.Id}}' $(printf %q "$image")" 2>/dev/null)
    [ "$got" = "$head_id" ] || { echo "$name: $image is ${got:-missing}, the head has $head_id" >&2; rc=1; }
done
exit $rc
