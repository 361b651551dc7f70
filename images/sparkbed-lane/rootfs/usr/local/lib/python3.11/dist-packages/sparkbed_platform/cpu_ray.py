"""The bed's vLLM platform: the CPU platform, with a rank per stand-in GPU under Ray."""

from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    """vLLM's CPU platform, placing each Ray rank on one GPU resource of its node."""

    ray_device_key = "GPU"
    # Ray would narrow CUDA_VISIBLE_DEVICES to the rank's GPU; vLLM's CUDA platform asks it not to, and
    # the CPU build has nothing to narrow.
    ray_noset_device_env_vars = ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # A module of its own: it imports vllm.distributed, which needs this platform resolved first.
        return "sparkbed_platform.communicator.NodeAwareCpuCommunicator"
