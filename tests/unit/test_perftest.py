"""sparkinfra.perftest: ib_write_bw's commands and its result table (perftest 4.5's format)."""

from sparkinfra.perftest import average_gbps, command

CLIENT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : rocep1s0f0
 Number of qps   : 1		Transport type : IB
 Connection type : RC		Using SRQ      : OFF
 TX depth        : 128
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0108 PSN 0x4a4c8b RKey 0x1fffbd VAddr 0x007f0e0c7d5000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1081520          0.00               94.51  		   0.180260
---------------------------------------------------------------------------------------
"""


def test_the_average_is_read_from_the_table():
    assert average_gbps(CLIENT) == 94.51
    assert average_gbps(" Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor for socket connection") is None


def test_server_and_client_commands():
    assert command("mlx5_0", 1, "5", 18515) == "ib_write_bw -d mlx5_0 -i 1 -x 5 -F --report_gbits -D 5 -p 18515"
    assert command("mlx5_1", 1, "3", 18516, "10.0.0.2") == (
        "ib_write_bw -d mlx5_1 -i 1 -x 3 -F --report_gbits -D 5 -p 18516 10.0.0.2")
