#!/bin/sh
# facts.mesh.AuthorizedKeys: USER's home, then the kind, owner, group and mode of ~/.ssh and
# ~/.ssh/authorized_keys (directory, file, absent or other), then that file's lines. Nothing
# when USER has no home.
#   authorized_keys.sh USER
h=$(getent passwd "$1" | cut -d: -f6)
[ -n "$h" ] || exit 0
echo "$h"
for p in "$h/.ssh" "$h/.ssh/authorized_keys"; do
    if [ -L "$p" ]; then echo other
    elif [ -d "$p" ]; then stat -c "directory %U %G %a" -- "$p"
    elif [ -f "$p" ]; then stat -c "file %U %G %a" -- "$p"
    elif [ -e "$p" ]; then echo other
    else echo absent; fi
done
cat -- "$h/.ssh/authorized_keys" 2>/dev/null || true
