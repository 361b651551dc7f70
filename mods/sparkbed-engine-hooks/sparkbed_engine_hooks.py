"""
The bed's engine hooks (mod sparkbed-engine-hooks), imported by a .pth in every Python process of
the container: when ``vllm.v1.engine.core`` is imported, its ``EngineCore`` is wrapped as the
lane's environment asks (``SPARKBED_STEP_DELAY``: seconds slept before every step;
``SPARKBED_ENGINE_FAIL=1``: the engine refuses to start). Nothing is hooked when neither is set.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

DELAY = float(os.environ.get("SPARKBED_STEP_DELAY") or 0)
FAIL = os.environ.get("SPARKBED_ENGINE_FAIL") == "1"
TARGET = "vllm.v1.engine.core"


def _hook(module):
    core = module.EngineCore
    if FAIL:
        def refuse(self, *args, **kwargs):
            raise RuntimeError("mod sparkbed-engine-hooks: the engine refuses to start (SPARKBED_ENGINE_FAIL=1)")

        core.__init__ = refuse
    if DELAY:
        for name in ("step", "step_with_batch_queue"):
            step = getattr(core, name, None)
            if step is None:
                continue

            def slow(self, *args, _step=step, **kwargs):
                time.sleep(DELAY)
                return _step(self, *args, **kwargs)

            setattr(core, name, slow)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` as Python would, then hooks it once its module has run."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hook(module)

        spec.loader.exec_module = exec_module
        return spec


if DELAY or FAIL:
    sys.meta_path.insert(0, _Finder())
