#!/bin/sh
# A lane's mods applied inside its container before the lane's command runs (eugr v1: a mod is a
# folder with run.sh and its files). In order, each from a writable copy of its folder, as eugr's
# launcher copies it into the container; a mod that fails stops the start, naming it.
#
#   apply_mods.sh DIR MOD... -- COMMAND...    (DIR holds one folder per mod, read-only)
set -eu
dir=$1
shift
work=${SPARKINFRA_MODS_WORK:-/tmp/sparkinfra-mods}
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    rm -rf "${work:?}/$1"
    mkdir -p "$work"
    cp -R "$dir/$1" "$work/$1"
    if ! (cd "$work/$1" && bash ./run.sh); then
        echo "mod $1: run.sh failed: the lane does not start" >&2
        exit 1
    fi
    echo "mod $1: applied"
    shift
done
[ "$#" -gt 0 ] && shift
exec "$@"
