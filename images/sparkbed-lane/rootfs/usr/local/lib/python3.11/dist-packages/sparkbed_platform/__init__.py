"""
sparkbed: vLLM's CPU platform with a Ray device, so a Ray lane runs on the bed as on a Spark.

vLLM's CPU platform names no Ray device (``ray_device_key`` is empty), so its Ray executor refuses
to start ("current platform cpu does not support ray"). On a Spark each rank is placed on the
node's one GPU; this platform places it on the one GPU the bed's ``ray`` wrapper declares per node.
Everything else is the CPU platform's. Loaded through the ``vllm.platform_plugins`` entry point of
the image's ``sparkbed_platform`` distribution: the bed's image only, never the controller's vLLM.
"""


def register() -> str:
    """The entry point: the platform's qualified class name (a class module imports vLLM)."""
    return "sparkbed_platform.cpu_ray.CpuRayPlatform"
