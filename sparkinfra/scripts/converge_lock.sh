#!/bin/sh
# Run on a cluster's head over the converge's own SSH connection: hold the converge lock for as
# long as this shell lives (its stdin is the connection: a run that dies drops the lock with it).
# Prints BUSY (and the holder) when another run holds it, else STALE (and the holder a run that
# did not finish left) or FREE, writes HOLDER, prints HELD, and waits for "release".
#
#   converge_lock.sh LOCK HOLDER_FILE HOLDER
set -u
lock=$1; holder_file=$2; holder=$3
dir=$(dirname "$lock"); [ -d "$dir" ] || mkdir -m 700 "$dir"
exec 9>>"$lock"
if ! flock -n 9; then echo BUSY; head -n1 "$holder_file" 2>/dev/null || echo; exit 1; fi
if [ -s "$holder_file" ]; then echo STALE; head -n1 "$holder_file"; else echo FREE; echo; fi
printf '%s\n' "$holder" > "$holder_file"
echo HELD
read -r line
[ "$line" = release ] && rm -f "$holder_file"
exit 0
