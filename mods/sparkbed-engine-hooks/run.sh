#!/bin/bash
# The bed's stand-in for a mod that changes the engine, as field mods patch vLLM: a .pth hook that
# wraps vLLM's EngineCore when a process imports it. The lane's environment switches it:
#   SPARKBED_STEP_DELAY=SECONDS  every engine step sleeps first (a slower decode, for the canary)
#   SPARKBED_ENGINE_FAIL=1       the engine refuses to start (a start that fails after the head's
#                                in-image check passed: the check builds no engine)
# Neither set: the hook installs nothing, and the engine is vLLM's own.
set -euo pipefail
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
install -D -m 644 sparkbed_engine_hooks.py "$site/sparkbed_engine_hooks.py"
echo "import sparkbed_engine_hooks" > "$site/sparkbed_engine_hooks.pth"
echo "sparkbed-engine-hooks: step delay ${SPARKBED_STEP_DELAY:-none}, engine fail ${SPARKBED_ENGINE_FAIL:-no}"
