"""
sparkbed: vLLM's CPU platform with a Ray device, so a Ray lane runs on the bed as on a Spark.

vLLM's CPU platform names no Ray device (``ray_device_key`` is empty), so its Ray executor refuses
to start ("current platform cpu does not support ray"). On a Spark each rank is placed on the
node's one GPU; this platform places it on the one GPU the bed's ``ray`` wrapper declares per node.
Everything else is the CPU platform's. Loaded through the ``vllm.platform_plugins`` entry point of
the image's ``sparkbed_platform`` distribution: the bed's image only, never the controller's vLLM.

Like a CUDA torch, every vLLM process that resolves the platform loads ``libnccl.so.2`` by name
(``RTLD_GLOBAL``), once: ``/proc/<pid>/maps`` then shows which NCCL file it mapped (with
``LD_PRELOAD`` of the pin, the pin; without, what the dynamic linker finds: the image's system copy).
"""

import ctypes
import sys

_nccl = None  # the loaded library (False: tried, and it could not be loaded)


def _load_nccl() -> None:
    global _nccl
    if _nccl is not None:
        return
    try:
        _nccl = ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        _nccl = False
        print(f"sparkbed_platform: could not load libnccl.so.2: {e}", file=sys.stderr, flush=True)


def register() -> str:
    """The entry point: the platform's qualified class name (a class module imports vLLM)."""
    _load_nccl()
    return "sparkbed_platform.cpu_ray.CpuRayPlatform"
