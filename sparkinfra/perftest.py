"""
perftest's ``ib_write_bw`` from the head to a worker over the fabric, on every HCA at once (the
verify suite's ``--fabric-bandwidth``): the commands each side runs, and the figure read from the
client's output.

    ib_write_bw -d rocep1s0f0 -i 1 -x 5 -F --report_gbits -D 5 -p 18515              # on the worker
    ib_write_bw -d rocep1s0f0 -i 1 -x 3 -F --report_gbits -D 5 -p 18515 10.0.0.2     # on the head

Each side gives its own GID index (``-x``: the node's ``NCCL_IB_GID_INDEX``, the RoCE v2 row of its
fabric IPv4), so the test runs over the same GIDs NCCL uses. The client ends with perftest's table::

     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      1081520          0.00               94.51                0.180260
"""

from __future__ import annotations

import re
import shlex

BASE_PORT = 18515  # perftest's own default for its connection exchange; the next HCA takes the next
SECONDS = 5

_ROW = re.compile(r"^\s*(?P<bytes>\d+)\s+(?P<iterations>\d+)\s+(?P<peak>[\d.]+)\s+(?P<average>[\d.]+)\s+[\d.]+\s*$", re.M)


def command(device: str, rdma_port: int, gid_index: str, tcp_port: int, server_ip: str = "",
            seconds: int = SECONDS) -> str:
    """The ``ib_write_bw`` of one HCA: the server's without ``server_ip``, else the client's."""
    args = ["ib_write_bw", "-d", device, "-i", str(rdma_port), "-x", gid_index, "-F", "--report_gbits",
            "-D", str(seconds), "-p", str(tcp_port)]
    return shlex.join([*args, *([server_ip] if server_ip else [])])


def average_gbps(output: str) -> float | None:
    """The client's average bandwidth in Gb/s (``--report_gbits``), or None when it printed no result."""
    rows = _ROW.findall(output)
    return float(rows[-1][3]) if rows else None
