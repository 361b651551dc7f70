#!/bin/bash
# Run as root on the head: one docker save of IMAGE, teed to a docker load on each worker through
# the SSH mesh, all at once (the head reads and packs the image once, however many workers receive
# it); then each worker's image ID (said by the same SSH session after its load), checked against
# the head's. A worker that fails to load does not stop the others; it ends the script with an
# error naming both IDs.
#
# Prints every PROGRESS_EVERY seconds (default 5) what tee has read of the stream (its rchar in
# /proc: no copy of the stream more), against the image's unpacked size (docker's .Size: the saved
# stream is about that, less when the store keeps layers compressed), then what it sent:
#   image NAME: 120 of about 324 MiB to spark-2, spark-3, 40 MiB/s, ETA 5 s
#   image NAME: 324 MiB to spark-2, spark-3 in 8 s, 40 MiB/s
#
#   image_fanout.sh IMAGE HEAD_ID NAME=IP...
set -u -o pipefail
image=$1; head_id=$2; shift 2
ssh_mesh=(ssh -o BatchMode=yes -o Compression=no)
every=${PROGRESS_EVERY:-5}
rc=0; pids=; fifos=$(mktemp -d); trap 'rm -rf "$fifos"' EXIT
outputs=(); names=()
# Each worker loads, then says the ID it now has, in the same SSH session (no second handshake).
load="sudo -n docker load -q > /dev/null && sudo -n docker image inspect --format '{{.Id}}' $(printf %q "$image")"
for worker in "$@"; do
    ip=${worker#*=}
    mkfifo "$fifos/$ip"
    "${ssh_mesh[@]}" "$ip" "$load" < "$fifos/$ip" > "$fifos/$ip.id" 2> /dev/null & pids="$pids $!"
    outputs+=("$fifos/$ip")
    names+=("${worker%%=*}")
done
to=$(IFS=,; echo "${names[*]}"); to=${to//,/, }
total=$(docker image inspect --format '{{.Size}}' "$image" 2> /dev/null) || total=
[[ $total =~ ^[0-9]+$ ]] || total=

# rchar PID: the bytes PID has read (and read from the processes it has reaped), in $r; 0 if gone.
rchar() {
    local key value
    r=0
    while read -r key value; do
        [ "$key" = rchar: ] && { r=$value; return; }
    done 2> /dev/null < "/proc/$1/io"
}

# The stream's reader, in a subshell of its own: tee in the background (its PID for the progress
# lines), reaped here, so what it read adds to this subshell's own count: the bytes sent, known
# once tee is gone. -p: a worker whose load ends early does not cut the stream to the others.
send() {
    local base tee status
    rchar "$BASHPID"; base=$r
    exec 3<&0  # a background command's stdin would be /dev/null
    tee -p "${outputs[@]}" <&3 > /dev/null 3<&- & tee=$!
    exec 3<&-
    echo "$tee" > "$fifos/tee.pid"
    wait "$tee"; status=$?
    rchar "$BASHPID"; echo $((r - base)) > "$fifos/sent"
    return $status
}

progress() {
    local nap='' tee='' sent rate line
    trap 'kill $nap 2> /dev/null; exit 0' TERM
    while sleep "$every" & nap=$!; wait $nap; do
        [ -n "$tee" ] || read -r tee 2> /dev/null < "$fifos/tee.pid" || continue
        rchar "$tee"; sent=$r
        rate=$(( sent / ((SECONDS - start) > 0 ? SECONDS - start : 1) ))
        if [ -n "$total" ] && [ "$sent" -lt "$total" ]; then
            line="$((sent >> 20)) of about $((total >> 20)) MiB to $to, $((rate >> 20)) MiB/s"
            [ "$rate" -gt 0 ] && line="$line, ETA $(( (total - sent) / rate )) s"
        else
            line="$((sent >> 20)) MiB to $to, $((rate >> 20)) MiB/s"
        fi
        echo "image $image: $line"
    done
}

start=$SECONDS
progress & reporter=$!
docker save "$image" | send || rc=1
kill $reporter 2> /dev/null; wait $reporter
for p in $pids; do wait "$p" || rc=1; done
read -r sent 2> /dev/null < "$fifos/sent" || sent=0
s=$((SECONDS - start))
echo "image $image: $((sent >> 20)) MiB to $to in $s s, $(( sent / (s > 0 ? s : 1) >> 20 )) MiB/s"
for worker in "$@"; do
    name=${worker%%=*}; ip=${worker#*=}
    read -r got 2> /dev/null < "$fifos/$ip.id" || got=
    [ "$got" = "$head_id" ] || { echo "$name: $image is ${got:-missing}, the head has $head_id" >&2; rc=1; }
done
exit $rc
