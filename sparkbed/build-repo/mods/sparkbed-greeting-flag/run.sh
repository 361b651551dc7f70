#!/bin/bash
# A mod of the bed's build repository (eugr v1: run.sh and its files, run from a writable copy in the
# lane's container before its command): gives the image's vLLM a `vllm serve` flag it does not have,
# --sparkbed-greeting TEXT, as a real mod adds a parser or an option. The hook (sparkbed_greeting.py,
# loaded by a .pth file at every python3 start) adds the flag to vLLM's serve argument parser once
# vLLM builds it, so `vllm serve` and the in-image validation both take it; a server started with it
# logs "sparkbed greeting: TEXT".
set -euo pipefail
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
install -D -m 644 sparkbed_greeting.py "$site/sparkbed_greeting.py"
install -D -m 644 sparkbed_greeting.pth "$site/sparkbed_greeting.pth"
marks=${SPARKBED_MOD_DIR:-/etc/sparkbed-mod}  # another folder: a test's
mkdir -p "$marks"
echo sparkbed-greeting-flag >> "$marks/applied"
echo "sparkbed-greeting-flag: vllm serve --sparkbed-greeting, hooked in $site"
