#!/bin/bash
# A mod of the bed's build repository: leaves a mark in the container, the file it carries (at
# /etc/sparkbed-mod/stamp), and its name on /etc/sparkbed-mod/applied (the order the mods ran in).
# SPARKBED_MOD_DIR: another folder than /etc/sparkbed-mod (a test's).
set -euo pipefail
marks=${SPARKBED_MOD_DIR:-/etc/sparkbed-mod}
install -D -m 644 stamp "$marks/stamp"
echo sparkbed-stamp >> "$marks/applied"
