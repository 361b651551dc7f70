"""
Runs inside a lane's container, with the rank's own docker options and env files, before vLLM
starts (``lane_ctl.py pre``/``check``; stdlib only, any python3 in the image): what a rank needs
from the node that the image alone cannot show, checked in seconds rather than after a weight load.

    python3 container_check.py --nccl-version 2.30.7 [--rdma --rdma-port 1]
    python3 container_check.py --find-nccl     # every libnccl.so* file here, one per line

- nccl: ``libnccl.so.2`` as any library loads it by name (the pin through ``LD_PRELOAD``, else
  whatever copy the image carries), ``VLLM_NCCL_SO_PATH``, every ``libnccl.so*`` file in the
  container loaded by its path (pip's ``nvidia/nccl/lib``, the system's: what torch or Ray load,
  each with the pin mounted over it) and, where torch has CUDA, torch's own NCCL all report the
  pinned version.
- rdma: the verbs devices are in the container and every ``NCCL_IB_HCA`` port is ACTIVE.
- gid: ``NCCL_IB_GID_INDEX`` is the RoCE v2 row carrying this node's fabric IPv4 (``VLLM_HOST_IP``)
  on every HCA of ``NCCL_IB_HCA`` (NCCL takes one index for all).

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


def check_nccl(pin, root="/"):
    found = [("libnccl.so.2", nccl_version("libnccl.so.2"))]
    pinned = os.environ.get("VLLM_NCCL_SO_PATH", "")
    if pinned:
        found.append((f"VLLM_NCCL_SO_PATH {pinned}", nccl_version(pinned)))
    copies = [path for path in nccl_copies(root) if path != pinned]
    found += [(path, nccl_version(path)) for path in copies]
    if _torch_has_cuda():  # vLLM's own path to NCCL (importing a CPU torch would only cost seconds)
        try:
            import torch

            if torch.cuda.is_available():
                found.append(("torch", ".".join(str(x) for x in torch.cuda.nccl.version())))
        except Exception as exc:
            found.append((f"torch ({type(exc).__name__}: {exc})", None))
    wrong = [f"{where} is {version or 'not loadable'}" for where, version in found if version != pin]
    if wrong:
        preload = os.environ.get("LD_PRELOAD") or "unset"
        return False, f"{'; '.join(wrong)}, the pin is {pin} (LD_PRELOAD {preload})"
    return True, f"{pin} through " + ", ".join(where for where, _ in found if where not in copies) + (
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


def gid_row(hca, port, index, ip):
    """None when row ``index`` of ``hca``'s port is the RoCE v2 GID of ``ip``, else what it is."""
    base = f"{SYSFS}/{hca}/ports/{port}"
    try:
        with open(f"{base}/gids/{index}") as f:
            gid = f.read().strip()
        with open(f"{base}/gid_attrs/types/{index}") as f:
            kind = f.read().strip()
    except OSError as exc:
        return f"{hca} port {port} has no GID row {index} ({exc.strerror})"
    try:
        carries = ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(f"::ffff:{ip}")
    except ValueError:
        carries = False
    if not carries or kind != "RoCE v2":
        return f"row {index} of {hca} port {port} is {gid} ({kind}), not RoCE v2 for {ip}"
    return None


def check_gid(port):
    hcas = ib_hcas()
    index, ip = os.environ.get("NCCL_IB_GID_INDEX", ""), os.environ.get("VLLM_HOST_IP", "")
    if not hcas or not index.isdigit() or not ip:
        return False, f"NCCL_IB_HCA {hcas or 'unset'}, NCCL_IB_GID_INDEX {index or 'unset'}, VLLM_HOST_IP {ip or 'unset'}"
    wrong = [problem for problem in (gid_row(hca, port, index, ip) for hca in hcas) if problem]
    if wrong:
        return False, "; ".join(wrong)
    return True, f"row {index} of {', '.join(hcas)} port {port} is RoCE v2 for {ip}"


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--nccl-version")
    parser.add_argument("--rdma", action="store_true")
    parser.add_argument("--rdma-port", type=int, default=1)
    parser.add_argument("--find-nccl", action="store_true")
    parser.add_argument("--root", default="/", help="the tree searched for libnccl.so* files (the container's /)")
    args = parser.parse_args(argv)
    if args.find_nccl:
        print("\n".join(nccl_copies(args.root)))
        return 0
    if not args.nccl_version:
        parser.error("--nccl-version is required")
    checks = [("nccl", check_nccl(args.nccl_version, args.root))]
    if args.rdma:
        checks += [("rdma", check_rdma(args.rdma_port)), ("gid", check_gid(args.rdma_port))]
    for name, (ok, detail) in checks:
        print(f"container check: {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return 0 if all(ok for _, (ok, _) in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
