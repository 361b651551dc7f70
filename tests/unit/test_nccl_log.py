"""sparkinfra.nccl_log: NCCL's start-up lines (NCCL_DEBUG=INFO, INIT,NET) in a rank's log, in NCCL's own formats."""

from __future__ import annotations

from sparkinfra.nccl_log import NcclStart, parse, problems

HEAD = """\
(EngineCore pid=212) spark-1:212:212 [0] NCCL INFO cudaDriverVersion 13000
(EngineCore pid=212) spark-1:212:212 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp1s0f0np0
(EngineCore pid=212) spark-1:212:212 [0] NCCL INFO Bootstrap : Using enp1s0f0np0:10.0.0.1<0>
(EngineCore pid=212) NCCL version 2.30.7+cuda13.0
(EngineCore pid=212) spark-1:212:530 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.
(EngineCore pid=212) spark-1:212:530 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:10.0.0.1<0>
(EngineCore pid=212) spark-1:212:530 [0] NCCL INFO Using network IB
(EngineCore pid=212) INFO 12-05 02:11:09 [pynccl.py:111] vLLM is using nccl==2.30.7
"""  # noqa: E501 (NCCL's own lines)
WORKER_ON_TCP = """\
spark-2:98:98 [0] NCCL INFO Bootstrap : Using enp1s0f0np0:10.0.0.2<0>
spark-2:98:301 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 5.
spark-2:98:301 [0] NCCL INFO NET/IB : No device found.
spark-2:98:301 [0] NCCL INFO NET/Socket : Using [0]enp1s0f0np0:10.0.0.2<0>
spark-2:98:301 [0] NCCL INFO Using network Socket
"""
PLAN = {"rdma": True, "hcas": ["rocep1s0f0", "roceP2p1s0f0"], "port": 1}


def test_the_heads_lines_are_read():
    assert parse(HEAD) == NcclStart(version="2.30.7", networks=["IB"], hcas=["rocep1s0f0:1", "roceP2p1s0f0:1"],
                                    gid_index="3")
    assert problems(parse(HEAD), pin="2.30.7", gid_index="3", **PLAN) == []


def test_a_rank_that_fell_back_to_tcp_is_named():
    found = problems(parse(WORKER_ON_TCP), pin=None, gid_index="5", **PLAN)
    assert found == ["NCCL's network is Socket, not IB (RDMA)",
                     "NET/IB uses no HCA, the cluster's are rocep1s0f0:1 roceP2p1s0f0:1"]


def test_another_version_another_gid_and_one_hca_are_named():
    log = HEAD.replace("2.30.7+cuda13.0", "2.29.7+cuda13.0").replace(" [1]roceP2p1s0f0:1/RoCE", "")
    found = problems(parse(log), pin="2.30.7", gid_index="5", **PLAN)
    assert found == ["NCCL 2.29.7 started, the pin is 2.30.7",
                     "NET/IB uses rocep1s0f0:1, the cluster's are rocep1s0f0:1 roceP2p1s0f0:1",
                     "NCCL took GID index 3, this node's is 5"]


def test_a_log_without_nccl_lines_says_so_and_a_lane_without_rdma_checks_only_the_version():
    assert problems(parse("INFO Application startup complete."), pin=None, gid_index="3", **PLAN) == [
        "no NCCL start-up lines (NCCL_DEBUG is not INFO, or NCCL never started)"]
    assert problems(parse(WORKER_ON_TCP + "NCCL version 2.30.7+cuda13.0\n"), pin="2.30.7", gid_index="3",
                    **{**PLAN, "rdma": False}) == []


def test_the_last_start_in_a_log_counts():
    log = HEAD.replace("2.30.7+cuda13.0", "2.29.7+cuda13.0") + HEAD
    assert parse(log).version == "2.30.7"
