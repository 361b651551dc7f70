#!/usr/bin/python3 -Xstand-in=sparkinfra-test-bed
"""
STAND-IN (sparkinfra test bed): keeps a fabricated /sys/class/infiniband tree in step with the
netdevs' live state, the way mlx5 fills a ConnectX-7 port's GID table, and makes the
/dev/infiniband device nodes (uverbs per RDMA device, rdma_cm) a lane's container is given.

One RDMA device per netdev (``SPARKBED_RDMA_PAIRS``: ``dev=netdev`` words; a GB10 has four: two
QSFP ports, two PCIe functions, "twins", each). Each device's table is filled from ITS OWN netdev:
rows 0/1 are its MAC-derived link-local GID (RoCE v1, RoCE v2); every other address of that
netdev (IPv6 non-link-local, every IPv4 including 169.254/16 link-local) takes the first free pair
of rows when it appears (v1 then v2) and frees it when it goes. Unused rows read as zeros with
empty type/ndev. ``device/net/<netdev>/`` (what ibdev2netdev reads) and ``netdev`` name the
netdev; port state follows its operstate.
"""

import ipaddress
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

PAIRS = [word.split("=", 1) for word in os.environ.get(
    "SPARKBED_RDMA_PAIRS",
    "rocep1s0f0=enp1s0f0np0 rocep1s0f1=enp1s0f1np1 roceP2p1s0f0=enP2p1s0f0np0 roceP2p1s0f1=enP2p1s0f1np1",
).split()]
DEVICES = sorted(dev for dev, _ in PAIRS)
PORT = 1
ROWS = 32
CLASS = Path("/sys/class")
SAVED = Path("/run/sparkbed/sysclass")
SLOTS = Path("/run/sparkbed/gid_slots.json")
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
LINK_WIDTH = "4"  # lanes of each function's PCIe link (the bed's figure)
FW_VER = "28.45.1200"  # the ConnectX-7 firmware the stand-in reports (the bed's figure)
_written: dict[Path, str] = {}


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
    nodes = {f"uverbs{i}": (231, 192 + i) for i in range(len(DEVICES))}  # one per RDMA device
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


def read_netdevs():
    """``{netdev: (mac, [addresses other than the IPv6 link-local])}`` for every netdev there is."""
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True)
    found = {}
    for info in json.loads(out.stdout or "[]"):
        addresses = []
        for a in info.get("addr_info", []):
            addr = ipaddress.ip_address(a["local"])
            if addr.version == 6 and addr.is_link_local:
                continue
            addresses.append(str(addr))
        found[info["ifname"]] = (info.get("address", "00:00:00:00:00:00"), addresses)
    return found


def assign_slots(netdev, addresses, table):
    """Pairs of rows per address of one netdev, kept while the address stays (like the kernel's GID cache)."""
    slots = {a: s for a, s in table.get(netdev, {}).items() if a in addresses}
    used = set(slots.values())
    for address in addresses:
        if address not in slots:
            pair = next(p for p in range(1, ROWS // 2) if p not in used)
            slots[address] = pair
            used.add(pair)
    table[netdev] = slots
    return slots


def write(path, text):
    if _written.get(path) == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)
    _written[path] = text


def render():
    netdevs = read_netdevs()
    try:
        table = json.loads(SLOTS.read_text())
    except (OSError, ValueError):
        table = {}
    for dev, netdev in PAIRS:
        if netdev not in netdevs:
            continue
        mac, addresses = netdevs[netdev]
        slots = assign_slots(netdev, addresses, table)
        local = gid_of(link_local_from_mac(mac))
        rows = {0: (local, "IB/RoCE v1"), 1: (local, "RoCE v2")}
        for address, pair in slots.items():
            gid = gid_of(ipaddress.ip_address(address))
            rows[2 * pair] = (gid, "IB/RoCE v1")
            rows[2 * pair + 1] = (gid, "RoCE v2")
        try:
            operstate = Path(f"/sys/class/net/{netdev}/operstate").read_text().strip()
        except OSError:
            operstate = "down"
        top = CLASS / "infiniband" / dev
        port = top / "ports" / str(PORT)
        for i in range(ROWS):
            gid, kind = rows.get(i, (ZERO, ""))
            write(port / "gids" / str(i), gid + "\n")
            write(port / "gid_attrs" / "types" / str(i), kind + ("\n" if kind else ""))
            write(port / "gid_attrs" / "ndevs" / str(i), (netdev + "\n") if kind else "")
        write(port / "state", "4: ACTIVE\n" if operstate == "up" else "1: DOWN\n")
        write(port / "phys_state", "5: LinkUp\n" if operstate == "up" else "3: Disabled\n")
        write(port / "link_layer", "Ethernet\n")
        write(top / "netdev", netdev + "\n")
        # On a node ``device`` is the PCI function; its net/ holds the function's netdev.
        (top / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
        # The width the function's PCIe link trained at, fixed from boot (a fault writes 2 to
        # current_link_width, as an old BIOS trains the second controller), and its firmware.
        for name, text in (("device/current_link_width", LINK_WIDTH), ("device/max_link_width", LINK_WIDTH),
                           ("fw_ver", FW_VER)):
            if not (top / name).exists():
                write(top / name, text + "\n")
    SLOTS.parent.mkdir(parents=True, exist_ok=True)
    SLOTS.write_text(json.dumps(table))


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
