#!/bin/sh
# facts.files.FileState: the kind of PATH (file, absent, or other: a link, folder or device in the
# way), its mode, owner, group and sha1 if a file, and whether its folder exists.
#   file_state.sh PATH
p=$1
if [ -L "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then echo other
elif [ -f "$p" ]; then stat -c "file %a %U %G" -- "$p" && sha1sum -- "$p"
else echo absent; fi
if [ -d "$(dirname -- "$p")" ]; then echo parent; else echo no-parent; fi
