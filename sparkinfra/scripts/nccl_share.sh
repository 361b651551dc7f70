#!/bin/sh
# The head gives its pinned NCCL build to workers over the fabric SSH mesh (as root on the head;
# each worker writes it as root through sudo), the library and its identity record, each
# replaced atomically. Run by deploys/prepare.py (nccl_shared) for the workers whose copy differs.
#
#   nccl_share.sh LIBRARY RECORD WORKER_IP...
set -eu
library=$1 record=$2
shift 2
if [ ! -f "$library" ] || [ ! -f "$record" ]; then
    echo "nccl: the head has no $library and $record to share" >&2
    exit 1
fi
size=$(( $(stat -c %s "$library") / 1048576 ))
status=0
for ip in "$@"; do
    started=$(date +%s)
    for file in "$library" "$record"; do
        dir=$(dirname "$file")
        # shellcheck disable=SC2029  # the paths are meant to expand here, on the head
        if ! ssh -o BatchMode=yes -o Compression=no "$ip" \
            "sudo -n sh -c 'mkdir -p $dir && cat > $file.part && chmod 644 $file.part && mv $file.part $file'" < "$file"; then
            echo "nccl: copying $file to $ip failed" >&2
            status=1
            continue 2
        fi
    done
    echo "nccl: $ip has the pin ($size MiB in $(( $(date +%s) - started )) s)"
done
exit $status
