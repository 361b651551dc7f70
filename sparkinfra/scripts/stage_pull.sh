#!/bin/sh
# Run as root on a worker (sent by stage_head.sh through the SSH mesh, read from stdin):
# fetch the head's manifest from its rsync daemon, drop what cannot be resumed, pull what is
# missing or short in parallel streams (resumed with --append-verify), then record this copy's
# own manifest. Prints its progress every PROGRESS_EVERY seconds (default 5), then what it pulled:
#   spark-2: 91 of 192 MiB, 18 MiB/s, ETA 5 s
#   spark-2: 192 MiB in 10 s, 19 MiB/s
#
#   stage_pull.sh REPO SOURCE STREAMS DEEP MANIFEST TOOL
#
#   REPO      the repository's folder in the HF cache (models--org--name)
#   SOURCE    the head's daemon, rsync://<head fabric ip>:<port>/stage/ (or a local folder)
#   STREAMS   parallel rsync streams
#   DEEP      1: hash every file, not only those whose size or mtime changed; 0: do not
#   MANIFEST  the manifest's file name in REPO
#   TOOL      the snapshot tool (snapshot_tool.py), base64
set -eu
repo=${1%/}; source=$2; streams=$3; deep=$4; manifest=$5; tool=$6
name=${repo##*/}; root=${repo%/*}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
printf %s "$tool" | base64 -d > "$work/tool.py"
mkdir -p "$repo"
rsync -a "$source$name/$manifest" "$work/manifest.json"
if [ "$deep" = 1 ]; then deep=--deep; else deep=; fi
# shellcheck disable=SC2086  # $deep: no word or one
python3 "$work/tool.py" plan "$repo" "$work/manifest.json" "$work" "$streams" $deep > "$work/plan.json"
cd "$root"

# Progress in the background, one line every PROGRESS_EVERY seconds: pyinfra -v shows each as it
# comes. Killing $progress ends the loop and its sleep at once: ssh returns only once nothing
# holds its output open.
need=$(sed 's/.*"bytes_needed": \([0-9]*\).*/\1/' "$work/plan.json")
start=$(du -sb "$repo" | cut -f1); t0=$(date +%s)
(
    nap=
    trap 'kill $nap 2>/dev/null; exit 0' TERM
    while sleep "${PROGRESS_EVERY:-5}" & nap=$!; wait $nap; do
        now=$(du -sb "$repo" | cut -f1); d=$((now - start))
        s=$(( $(date +%s) - t0 )); r=$(( d / (s > 0 ? s : 1) ))
        left=$(( need > d ? need - d : 0 ))
        echo "$(hostname): $((d >> 20)) of $((need >> 20)) MiB, $((r >> 20)) MiB/s, ETA $(( r > 0 ? left / r : 0 )) s"
    done
) & progress=$!
trap 'kill $progress 2>/dev/null || true; rm -rf "$work"' EXIT

pids=
for list in "$work"/list.*; do
    [ -e "$list" ] || continue
    rsync -a --partial --inplace --append-verify --files-from="$list" "$source" . > "$list.log" 2>&1 &
    pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=1; done
kill $progress 2>/dev/null; wait $progress || true  # no progress line after the last one
if [ $rc != 0 ]; then cat "$work"/list.*.log >&2; exit $rc; fi
d=$(( $(du -sb "$repo" | cut -f1) - start )); s=$(( $(date +%s) - t0 ))
python3 "$work/tool.py" adopt "$repo" "$work/manifest.json" "$work" > /dev/null
echo "$(hostname): $((d >> 20)) MiB in $s s, $(( d / (s > 0 ? s : 1) >> 20 )) MiB/s"
