#!/usr/bin/python3 -Xstand-in=sparkinfra-test-bed
"""
STAND-IN (sparkinfra test bed): keeps a fabricated /sys/class/infiniband tree in step with the
fabric interface's live state, the way mlx5 fills a ConnectX-7 port's GID table, and makes the
/dev/infiniband device nodes (uverbs per HCA, rdma_cm) a lane's container is given.

Rows 0/1 are the MAC-derived link-local GID (RoCE v1, RoCE v2); every other address of the
netdev takes the first free pair of rows when it appears (v1 then v2) and frees it when it goes.
Unused rows read as zeros with empty type/ndev. Both HCAs of the port (rocep1s0f0 and its twin)
show the same table, as on a Spark.
"""

import ipaddress
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

NETDEV = os.environ.get("SPARKBED_NETDEV", "enp1s0f0np0")
DEVICES = os.environ.get("SPARKBED_RDMA_DEVICES", "rocep1s0f0 roceP2p1s0f0").split()
PORT = 1
ROWS = 32
CLASS = Path("/sys/class")
SAVED = Path("/run/sparkbed/sysclass")
SLOTS = Path("/run/sparkbed/gid_slots.json")
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def sh(*args):
    subprocess.run(args, check=True)


def fabricate_class_dir():
    """Make /sys/class writable (tmpfs) while keeping every real class visible through binds."""
    if (CLASS / "infiniband").is_dir():
        return
    SAVED.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", str(CLASS), str(SAVED))
    # /sys is a shared mount: keep the tmpfs below from propagating onto the saved view.
    sh("mount", "--make-private", str(SAVED))
    entries = sorted(os.listdir(SAVED))
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "sparkbed-sysclass", str(CLASS))
    for entry in entries:
        (CLASS / entry).mkdir()
        sh("mount", "--bind", str(SAVED / entry), str(CLASS / entry))
    (CLASS / "infiniband").mkdir()


def make_devices():
    """The verbs device nodes mlx5 and rdma_ucm give a Spark (one uverbs per HCA, rdma_cm): what
    ``docker run --device /dev/infiniband`` hands a lane's container. Nothing opens them on the bed."""
    folder = Path("/dev/infiniband")
    folder.mkdir(exist_ok=True)
    nodes = {f"uverbs{i}": (231, 192 + i) for i in range(len(DEVICES))}
    nodes["rdma_cm"] = (10, 58)
    for name, (major, minor) in nodes.items():
        path = folder / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            path.chmod(0o666)


def gid_of(address):
    packed = address.packed if address.version == 6 else ipaddress.IPv6Address(f"::ffff:{address}").packed
    words = [packed[i:i + 2].hex() for i in range(0, 16, 2)]
    return ":".join(words)


def link_local_from_mac(mac):
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    return ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui))


def read_netdev():
    out = subprocess.run(["ip", "-j", "addr", "show", "dev", NETDEV], capture_output=True, text=True)
    info = json.loads(out.stdout or "[]")
    if not info:
        return None, []
    info = info[0]
    addresses = []
    for a in info.get("addr_info", []):
        addr = ipaddress.ip_address(a["local"])
        if addr.version == 6 and addr.is_link_local:
            continue
        addresses.append(str(addr))
    return info.get("address", "00:00:00:00:00:00"), addresses


def assign_slots(addresses):
    """Pairs of rows per address, kept while the address stays (like the kernel's GID cache)."""
    try:
        slots = json.loads(SLOTS.read_text())
    except (OSError, ValueError):
        slots = {}
    slots = {a: s for a, s in slots.items() if a in addresses}
    used = set(slots.values())
    for address in addresses:
        if address not in slots:
            pair = next(p for p in range(1, ROWS // 2) if p not in used)
            slots[address] = pair
            used.add(pair)
    SLOTS.parent.mkdir(parents=True, exist_ok=True)
    SLOTS.write_text(json.dumps(slots))
    return slots


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


def render():
    mac, addresses = read_netdev()
    if mac is None:
        return
    slots = assign_slots(addresses)
    rows = {0: (gid_of(link_local_from_mac(mac)), "IB/RoCE v1"), 1: (gid_of(link_local_from_mac(mac)), "RoCE v2")}
    for address, pair in slots.items():
        gid = gid_of(ipaddress.ip_address(address))
        rows[2 * pair] = (gid, "IB/RoCE v1")
        rows[2 * pair + 1] = (gid, "RoCE v2")
    try:
        operstate = Path(f"/sys/class/net/{NETDEV}/operstate").read_text().strip()
    except OSError:
        operstate = "down"
    for dev in DEVICES:
        port = CLASS / "infiniband" / dev / "ports" / str(PORT)
        for i in range(ROWS):
            gid, kind = rows.get(i, (ZERO, ""))
            write(port / "gids" / str(i), gid + "\n")
            write(port / "gid_attrs" / "types" / str(i), kind + ("\n" if kind else ""))
            write(port / "gid_attrs" / "ndevs" / str(i), (NETDEV + "\n") if kind else "")
        write(port / "state", "4: ACTIVE\n" if operstate == "up" else "1: DOWN\n")
        write(port / "phys_state", "5: LinkUp\n" if operstate == "up" else "3: Disabled\n")
        write(port / "link_layer", "Ethernet\n")
        write(CLASS / "infiniband" / dev / "netdev", NETDEV + "\n")


def main():
    fabricate_class_dir()
    make_devices()
    render()
    Path("/run/sparkbed/gid_ready").touch()  # the unit's ExecStartPost waits for the first table
    monitor = subprocess.Popen(["ip", "-o", "monitor", "link", "address"], stdout=subprocess.PIPE, text=True)
    print("rdma stand-in: GID table live", flush=True)
    for _ in monitor.stdout:
        time.sleep(0.05)  # let a burst of netlink events settle, then redraw once
        render()
    return monitor.wait()


if __name__ == "__main__":
    sys.exit(main())
