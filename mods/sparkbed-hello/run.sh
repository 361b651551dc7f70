#!/bin/bash
# The bed's mod (eugr v1 shape): run.sh and a file beside it. It leaves a mark in the container that
# the verify suite reads, from a file the mod carries, so a changed file is a changed mod.
set -euo pipefail
install -D -m 644 greeting /etc/sparkbed-mod/greeting
echo "sparkbed-hello: $(cat greeting)"
