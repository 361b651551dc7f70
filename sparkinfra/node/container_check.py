"""
Runs inside a lane's container, with the rank's own docker options and env files, before vLLM
starts (``lane_ctl.py pre``/``check``; stdlib only, any python3 in the image): what a rank needs
from the node that the image alone cannot show, checked in seconds rather than after a weight load.

    python3 container_check.py --nccl-version 2.30.7 [--rdma --rdma-port 1]
    python3 container_check.py --nccl-pin /opt/nccl/lib/libnccl.so.2 [--nccl-version 2.30.7] [--rdma ...]
    python3 container_check.py --find-nccl     # every libnccl.so* file here, one per line

- nccl: ``libnccl.so.2`` as any library loads it by name (the pin through ``LD_PRELOAD``, else
  whatever copy the image carries), ``VLLM_NCCL_SO_PATH``, every ``libnccl.so*`` file in the
  container loaded by its path (pip's ``nvidia/nccl/lib``, the system's: what torch or Ray load,
  each with the pin mounted over it) and, where torch has CUDA, torch's own NCCL all report the
  pinned version.
  With ``--nccl-pin PATH`` (the pin as mounted in the container; ``nccl_identity.py`` must be in
  this script's folder) a version is not enough: each copy must be the pin's bytes (sha256; the
  file ``libnccl.so.2`` by name maps, read from ``/proc/self/maps``), one of the pin's version but
  another build is named as such with its build-id; torch's NCCL is still compared by version, and
  ``--nccl-version``, when given too, is what the pin itself must report.
- rdma: the verbs devices are in the container and every ``NCCL_IB_HCA`` port is ACTIVE.
- gid: the row NCCL uses on each HCA of ``NCCL_IB_HCA`` (``NCCL_IB_GID_INDEX``, or unset NCCL's own
  choice) is an IPv4 RoCE v2 GID of that HCA's own netdev (a GB10's twins: each its own table), the
  fabric interface's (``NCCL_SOCKET_IFNAME``) the node's fabric IPv4 (``VLLM_HOST_IP``).

One line per check, ``container check: PASS|FAIL <check>: <detail>``; exit 1 when any failed.
"""

import argparse
import ctypes
import glob
import importlib.util
import ipaddress
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:  # mounted beside this file for --nccl-pin
    import nccl_identity
except ImportError:
    nccl_identity = None

SYSFS = "/sys/class/infiniband"
DEVICES = "/dev/infiniband"
NCCL_FILE = re.compile(r"libnccl\.so(\.[0-9]+)*$")
PSEUDO = ("/proc", "/sys", "/dev")  # kernel views, never the image's files


def nccl_version(library):
    """``ncclGetVersion`` of ``library`` (a path or a soname) as ``2.30.7``; None when it does not load."""
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return None
    code = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(code)) != 0:
        return None
    major, rest = divmod(code.value, 10000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_copies(root="/"):
    """Every regular file named ``libnccl.so*`` under ``root`` (its mounts included, ``/proc``,
    ``/sys``, ``/dev`` skipped), sorted; a symlink is the file it names."""
    found = []
    for top, dirs, files in os.walk(root):
        if top == root:
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in PSEUDO]
        for name in files:
            path = os.path.join(top, name)
            if NCCL_FILE.match(name) and os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return sorted(found)


def ib_hcas():
    """The devices of ``NCCL_IB_HCA`` (``=mlx5_0:1,mlx5_1`` -> ``["mlx5_0", "mlx5_1"]``; an exclusion list: none)."""
    value = os.environ.get("NCCL_IB_HCA", "")
    if value.startswith("^"):
        return []
    return [h.split(":")[0] for h in value.lstrip("=").split(",") if h]


def _torch_has_cuda():
    """Whether the image's torch is a CUDA build (its libtorch_cuda is there), without importing it."""
    spec = importlib.util.find_spec("torch")
    return bool(spec and spec.origin) and os.path.exists(os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cuda.so"))


def torch_nccl():
    """``[(where, version)]`` of torch's own NCCL where torch has CUDA (vLLM's own path to NCCL;
    importing a CPU torch would only cost seconds), else ``[]``."""
    if not _torch_has_cuda():
        return []
    try:
        import torch

        if torch.cuda.is_available():
            return [("torch", ".".join(str(x) for x in torch.cuda.nccl.version()))]
    except Exception as exc:  # noqa: BLE001 -- whatever torch raises is the line's detail
        return [(f"torch ({type(exc).__name__}: {exc})", None)]
    return []


def check_nccl(pin, root="/"):
    found = [("libnccl.so.2", nccl_version("libnccl.so.2"))]
    pinned = os.environ.get("VLLM_NCCL_SO_PATH", "")
    if pinned:
        found.append((f"VLLM_NCCL_SO_PATH {pinned}", nccl_version(pinned)))
    copies = [path for path in nccl_copies(root) if path != pinned]
    found += [(path, nccl_version(path)) for path in copies]
    found += torch_nccl()
    wrong = [f"{where} is {version or 'not loadable'}" for where, version in found if version != pin]
    if wrong:
        preload = os.environ.get("LD_PRELOAD") or "unset"
        return False, f"{'; '.join(wrong)}, the pin is {pin} (LD_PRELOAD {preload})"
    return True, f"{pin} through " + ", ".join(where for where, _ in found if where not in copies) + (
        f" and {len(copies)} copies in the image ({' '.join(copies)})" if copies else "")


def check_nccl_pin(pin_path, expected=None, root="/"):
    """Every copy of NCCL here against the pin's bytes (sha256): by name, VLLM_NCCL_SO_PATH, every
    libnccl.so* file; torch's by version."""
    ni = nccl_identity
    if ni is None:
        here = os.path.dirname(os.path.abspath(__file__))
        return False, f"nccl_identity.py is not beside container_check.py in {here}: --nccl-pin cannot compare builds"
    by_name = ni.loaded_identity("libnccl.so.2")  # first: a library loaded by path before would answer the name
    pin = ni.identity(pin_path, version=True)
    preload = os.environ.get("LD_PRELOAD") or "unset"
    if pin.get("error") or not pin.get("version"):
        return False, f"the pin {pin_path} is {pin.get('error') or 'not loadable'} (LD_PRELOAD {preload})"
    if expected and pin["version"] != expected:
        return False, f"the pin {pin_path} is {pin['version']}, not {expected}"
    where = "libnccl.so.2" if by_name.get("path") in (None, "libnccl.so.2", pin_path) else \
        f"libnccl.so.2 ({by_name['path']})"
    found = [(where, by_name)]
    pinned = os.environ.get("VLLM_NCCL_SO_PATH", "")
    if pinned:
        found.append((f"VLLM_NCCL_SO_PATH {pinned}", ni.identity(pinned, version=True)))
    copies = [path for path in nccl_copies(root) if path not in (pinned, pin_path)]
    found += [(path, ni.identity(path, version=True)) for path in copies]
    wrong = []
    for place, copy in found:
        if ni.same_build(copy, pin):
            continue
        if copy.get("error") and "sha256" not in copy:
            wrong.append(f"{place} is {copy['error']}")
        elif copy.get("version") == pin["version"]:
            wrong.append(f"{place} is {pin['version']} but another build ({ni.build_text(copy)})")
        else:
            wrong.append(f"{place} is {copy.get('version') or 'not loadable'}")
    torch = torch_nccl()
    wrong += [f"{place} is {version or 'not loadable'}" for place, version in torch if version != pin["version"]]
    build = f"build-id {ni.short(pin.get('build_id'))} sha256 {ni.short(pin['sha256'])}"
    if wrong:
        return False, f"{'; '.join(wrong)}, the pin is {pin['version']} {build} (LD_PRELOAD {preload})"
    through = [place for place, _ in found if place not in copies] + [place for place, _ in torch]
    return True, f"{pin['version']} {build} through " + ", ".join(through) + (
        f" and {len(copies)} copies in the image ({' '.join(copies)})" if copies else "")


def check_rdma(port):
    devices = sorted(os.path.basename(d) for d in glob.glob(f"{DEVICES}/uverbs*"))
    if not devices:
        return False, f"no {DEVICES}/uverbs* in the container: NCCL cannot open the HCA (docker --device)"
    hcas = ib_hcas()
    down = []
    for hca in hcas:
        try:
            with open(f"{SYSFS}/{hca}/ports/{port}/state") as f:
                state = f.read().strip()
        except OSError:
            state = "missing"
        if "ACTIVE" not in state:
            down.append(f"{hca} port {port}: {state}")
    if down:
        return False, "; ".join(down)
    return True, f"{' '.join(devices)}; {', '.join(hcas) or 'no NCCL_IB_HCA'} port {port} ACTIVE"


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def hca_netdev(hca):
    """The netdev of ``hca`` (its PCI function's ``net/``, as ibdev2netdev reads it); "" when unknown."""
    try:
        return sorted(os.listdir(f"{SYSFS}/{hca}/device/net"))[0]
    except (OSError, IndexError):
        return ""


def gid_rows(hca, port):
    """(index, gid, type, ndev) of every populated row of ``hca``'s port, by index."""
    base = f"{SYSFS}/{hca}/ports/{port}"
    try:
        indexes = sorted(int(i) for i in os.listdir(f"{base}/gids") if i.isdigit())
    except OSError:
        return []
    rows = []
    for index in indexes:
        gid, kind = _read(f"{base}/gids/{index}"), _read(f"{base}/gid_attrs/types/{index}")
        if gid and kind and set(gid) - {"0", ":"}:
            rows.append((index, gid, kind, _read(f"{base}/gid_attrs/ndevs/{index}") or ""))
    return rows


def ipv4_of(gid):
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def gid_row(hca, port, index, ip, fabric):
    """
    None when the row NCCL uses on ``hca`` is right, else what it is. The row is ``index``
    (``NCCL_IB_GID_INDEX``), or where it is unset NCCL's own choice (since 2.21: the first IPv4
    RoCE v2 row). It must be an IPv4 RoCE v2 GID of the HCA's own netdev; on the fabric
    interface's HCA (``fabric``) the node's fabric IP ``ip``.
    """
    netdev = hca_netdev(hca)
    rows = gid_rows(hca, port)
    where = f"{hca} ({netdev or '?'}) port {port}"
    if index:
        row = next((r for r in rows if str(r[0]) == index), None)
        used = f"row {index}"
    else:
        row = next((r for r in rows if r[2] == "RoCE v2" and ipv4_of(r[1])), None)
        used = f"NCCL's own row ({row[0] if row else 'none'})"
    if row is None:
        return f"{where}: {used} holds nothing"
    _, gid, kind, ndev = row
    if kind != "RoCE v2" or not ipv4_of(gid):
        return f"{where}: {used} is {gid} ({kind}), not an IPv4 RoCE v2 GID"
    if netdev and ndev and ndev != netdev:
        return f"{where}: {used} belongs to {ndev}, not {netdev}"
    if fabric and ipv4_of(gid) != ip:
        return f"{where}: {used} is RoCE v2 for {ipv4_of(gid)}, not for the fabric address {ip}"
    return None


def check_gid(port):
    hcas = ib_hcas()
    index, ip = os.environ.get("NCCL_IB_GID_INDEX", ""), os.environ.get("VLLM_HOST_IP", "")
    iface = os.environ.get("NCCL_SOCKET_IFNAME", "")
    if not hcas or (index and not index.isdigit()) or not ip:
        return False, f"NCCL_IB_HCA {hcas or 'unset'}, NCCL_IB_GID_INDEX {index or 'unset'}, VLLM_HOST_IP {ip or 'unset'}"
    netdevs = {hca: hca_netdev(hca) for hca in hcas}
    # The fabric interface's HCA carries the fabric IP; where netdevs are unknown, the first HCA.
    fabric = next((hca for hca in hcas if netdevs[hca] and netdevs[hca] == iface), hcas[0])
    wrong = [problem for problem in (gid_row(hca, port, index, ip, hca == fabric) for hca in hcas) if problem]
    if wrong:
        return False, "; ".join(wrong)
    said = ", ".join(f"{hca} ({netdevs[hca] or '?'})" for hca in hcas)
    if index:
        return True, f"row {index} of {said} port {port} is IPv4 RoCE v2 of each one's own netdev, {ip} on {fabric}"
    return True, f"NCCL picks each HCA's IPv4 RoCE v2 row on {said} port {port}, {ip} on {fabric}"


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--nccl-version")
    parser.add_argument("--nccl-pin", help="the pinned libnccl.so.2 as mounted here: compare builds, not versions")
    parser.add_argument("--rdma", action="store_true")
    parser.add_argument("--rdma-port", type=int, default=1)
    parser.add_argument("--find-nccl", action="store_true")
    parser.add_argument("--root", default="/", help="the tree searched for libnccl.so* files (the container's /)")
    args = parser.parse_args(argv)
    if args.find_nccl:
        print("\n".join(nccl_copies(args.root)))
        return 0
    if not args.nccl_version and not args.nccl_pin:
        parser.error("--nccl-version or --nccl-pin is required")
    if args.nccl_pin:
        checks = [("nccl", check_nccl_pin(args.nccl_pin, args.nccl_version, args.root))]
    else:
        checks = [("nccl", check_nccl(args.nccl_version, args.root))]
    if args.rdma:
        checks += [("rdma", check_rdma(args.rdma_port)), ("gid", check_gid(args.rdma_port))]
    for name, (ok, detail) in checks:
        print(f"container check: {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return 0 if all(ok for _, (ok, _) in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
