"""
The controller's side of the bed (``CONTROLLER_DIR``): its SSH key, known hosts and ssh config, the
pyinfra inventory entries built from them (``sim_hosts``), the NCCL stand-in libraries deploys
upload, the ``nvidia-nccl-cu13`` wheels of the hub's package index, the secrets a user's shell
would hold (the hub's token, the API key: ``controller_env``), and the hub (``hub.py``) serving the
tiny model, the package index and the git repositories (``GIT_ROOT``) in the management namespace.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
import sys
from pathlib import Path

from .layout import (CACHE, CONTROLLER_DIR, DEFAULT_SHAPE, MGMT_GATEWAY, MGMT_NS, STATE, _enter_own_cgroup,
                     compile_nccl_standin, sim_nodes)


# NCCL stand-ins (deploys upload them: group_data/bed.py)
# -------------------------------------------------------

NCCL_STANDIN_VERSIONS = ("2.30.7", "2.27.3")  # the pinned one, and one a node must not run


def nccl_standin(version: str) -> Path:
    """The bed's stand-in libnccl.so.2 reporting ``version`` (built on the controller side)."""
    return CONTROLLER_DIR / "nccl" / version / "libnccl.so.2"


def build_nccl_standins() -> None:
    for version in NCCL_STANDIN_VERSIONS:
        compile_nccl_standin(version, nccl_standin(version))
    build_nccl_wheels()


# The package index's wheels: NVIDIA's nvidia-nccl-cu13 layout around the stand-in
# -------------------------------------------------------------------------------

PYPI_ROOT = CONTROLLER_DIR / "pypi"  # the hub's index: every wheel here, one project per name
NCCL_WHEEL_PROJECT = "nvidia-nccl-cu13"
# (version, platform): the pin for the bed's x86_64 nodes and for a GB10 (its .so the same x86 stand-in:
# only there to prove platform selection), and a version a node must not run.
NCCL_WHEELS = (("2.30.7", "manylinux_2_18_x86_64"), ("2.30.7", "manylinux_2_18_aarch64"),
               ("2.27.3", "manylinux_2_18_x86_64"))
_ZIP_TIME = (2025, 1, 1, 0, 0, 0)  # fixed: the same wheel bytes (and sha256) on every bring-up


def nccl_wheel(version: str, platform: str = "manylinux_2_18_x86_64") -> Path:
    return PYPI_ROOT / f"nvidia_nccl_cu13-{version}-py3-none-{platform}.whl"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(path: Path, version: str, platform: str, library: bytes) -> None:
    """A wheel laid out as NVIDIA's: ``nvidia/nccl/lib/libnccl.so.2`` and the dist-info."""
    dist_info = f"nvidia_nccl_cu13-{version}.dist-info"
    files = {
        "nvidia/nccl/lib/libnccl.so.2": library,
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\nName: nvidia-nccl-cu13\n"
            f"Version: {version}\nSummary: NVIDIA Collective Communication Library (NCCL) Runtime "
            "(sparkinfra test bed stand-in: answers ncclGetVersion only)\nLicense: NVIDIA Proprietary Software\n"
            "Requires-Python: >=3\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sparkbed\nRoot-Is-Purelib: true\n"
            f"Tag: py3-none-{platform}\n"
        ).encode(),
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if name.endswith(".so.2") else 0o100644) << 16
            whl.writestr(info, data)
    tmp.replace(path)


def build_nccl_wheels() -> list[Path]:
    """The index's wheels (from the stand-ins ``build_nccl_standins`` compiled; the pin's bytes
    are ``nccl_standin("2.30.7")``'s, so a site's own upload and the index give the same file)."""
    PYPI_ROOT.mkdir(parents=True, exist_ok=True)
    made = []
    for version, platform in NCCL_WHEELS:
        library = nccl_standin(version)
        if not library.exists():
            compile_nccl_standin(version, library)
        path = nccl_wheel(version, platform)
        _write_wheel(path, version, platform, library.read_bytes())
        made.append(path)
    return made


# SSH to the nodes, and pyinfra's inventory entries
# -------------------------------------------------


def controller_key() -> Path:
    return CONTROLLER_DIR / "id_ed25519"


def known_hosts() -> Path:
    return CONTROLLER_DIR / "known_hosts"


def ssh_config() -> Path:
    return CONTROLLER_DIR / "ssh_config"


def sim_hosts(count: int = 2, shape: str = DEFAULT_SHAPE) -> list[tuple[str, dict]]:
    """pyinfra inventory entries for the bed's nodes (of ``shape``, as ``up`` made them)."""
    return [
        (
            node.name,
            {
                "ssh_hostname": node.mgmt_ip,
                "ssh_user": node.user,
                "ssh_key": str(controller_key()),
                "ssh_known_hosts_file": str(known_hosts()),
                "ssh_strict_host_key_checking": "yes",
                "rank": node.rank,
                "fabric_ip": node.fabric_ip,
            },
        )
        for node in sim_nodes(count, shape)
    ]


# Secrets, and the hub
# --------------------

# The bed's hub: a stand-in for huggingface.co (``hub.py``) in the management namespace, gated
# by a token; the head downloads the sim lane's model from it (settings: hf_endpoint).
HUB_ROOT = CACHE / "hub"
HUB_PORT = 8731
HUB_URL = f"http://{MGMT_GATEWAY}:{HUB_PORT}"
HUB_TOKEN_ENV = "SPARKBED_HF_TOKEN"
# The hub's package index (PEP 503, not gated): ``/simple/<project>/``, files under ``/packages/``.
NCCL_INDEX_URL = HUB_URL + "/simple"
HUB_DOWNLOADS = STATE / "hub-downloads.log"  # one line per .whl the hub served whole
# Git repositories on the hub (``/git/<name>.git``, read-only, smart and dumb HTTP), as GitHub serves
# a build repository: the bed's ``sparkbed-build.git`` (upstream.py), made afresh at every ``up``.
GIT_ROOT = STATE / "git"
# The bed's clusters' locks (sparkinfra.lock, each cluster's lock_file in group_data): the pins of
# this bed's upstream (its hub and build repository), made afresh with it at every bring-up.
LOCKS = CONTROLLER_DIR / "locks"


def lock_path(cluster: str) -> Path:
    """The lock file of the bed's cluster ``cluster`` (``sim``, ``sim4``, ``pair_a``...)."""
    return LOCKS / f"{cluster}.lock.yaml"
BUILD_REPO_NAME = "sparkbed-build.git"
BUILD_REPO_URL = f"{HUB_URL}/git/{BUILD_REPO_NAME}"


def nccl_index_downloads() -> int:
    """How many times a ``.whl`` was fully downloaded from the index since the hub started."""
    try:
        return len(HUB_DOWNLOADS.read_text().splitlines())
    except OSError:
        return 0


def hub_token_file() -> Path:
    return CONTROLLER_DIR / "hf_token"


API_KEY_ENV = "SPARKBED_API_KEY"


def api_key_file() -> Path:
    return CONTROLLER_DIR / "api_key"


def _secret(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(os.urandom(16).hex() + "\n")
    return path.read_text().strip()


def controller_env() -> dict[str, str]:
    """The controller's environment in the bed: the hub's token and the API key, as a user's shell holds them."""
    env = dict(os.environ)
    if CONTROLLER_DIR.exists():
        env[HUB_TOKEN_ENV] = _secret(hub_token_file())
        env[API_KEY_ENV] = _secret(api_key_file())
    return env


def _start_hub() -> int:
    """Serve HUB_ROOT at HUB_URL (the tiny model: repo SIM_MODEL, main on SIM_REVISION, made by
    ``upstream.fresh_upstream``), the package index at NCCL_INDEX_URL and GIT_ROOT's repositories
    (BUILD_REPO_URL), until the bed goes down."""
    token = hub_token_file()
    _secret(token)
    if not PYPI_ROOT.is_dir():
        build_nccl_wheels()
    HUB_DOWNLOADS.write_text("")  # counted since this hub started
    log_file = open(STATE / "hub.log", "a")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", MGMT_NS, sys.executable, "-m", "sparkbed.hub", "--root", str(HUB_ROOT),
         "--host", MGMT_GATEWAY, "--port", str(HUB_PORT), "--token-file", str(token),
         "--index", str(PYPI_ROOT), "--downloads", str(HUB_DOWNLOADS), "--git", str(GIT_ROOT)],
        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
        preexec_fn=lambda: _enter_own_cgroup("hub"),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    (STATE / "hub.pid").write_text(f"{proc.pid}\n")
    return proc.pid
