"""The CPU communicator of the bed's platform, for groups that span nodes."""

import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator, _CPUSHMDistributed


class NodeAwareCpuCommunicator(CpuCommunicator):
    """
    The CPU communicator, using its shared-memory path only when every rank of the group is on
    this host. vLLM's check compares group names derived from the init port, which every rank of a
    Ray cluster shares; ranks on two nodes then wait on a segment the other node cannot open
    ("open shm in SHMManager failed"). Across nodes the group talks gloo, as the mp lane does.
    """

    def _all_group_ranks_share_shm_group_name(self) -> bool:
        names: list[tuple[str, str] | None] = [None] * self.world_size
        local = (socket.gethostname(), _CPUSHMDistributed.make_group_name(self))
        torch.distributed.all_gather_object(names, local, group=self.device_group)
        return len(set(names)) == 1
