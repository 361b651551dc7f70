"""
The controller's side of the bed (``CONTROLLER_DIR``): its SSH key, known hosts and ssh config, the
pyinfra inventory entries built from them (``sim_hosts``), the NCCL stand-in libraries deploys
upload, the secrets a user's shell would hold (the hub's token, the API key: ``controller_env``),
and the hub (``hub.py``) serving the tiny model in the management namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .cache import SIM_MODEL, SIM_REVISION, build_tiny_model
from .layout import (CACHE, CONTROLLER_DIR, MGMT_GATEWAY, MGMT_NS, STATE, _enter_own_cgroup, compile_nccl_standin,
                     sim_nodes)


# NCCL stand-ins (deploys upload them: group_data/bed.py)
# -------------------------------------------------------

NCCL_STANDIN_VERSIONS = ("2.30.7", "2.27.3")  # the pinned one, and one a node must not run


def nccl_standin(version: str) -> Path:
    """The bed's stand-in libnccl.so.2 reporting ``version`` (built on the controller side)."""
    return CONTROLLER_DIR / "nccl" / version / "libnccl.so.2"


def build_nccl_standins() -> None:
    for version in NCCL_STANDIN_VERSIONS:
        compile_nccl_standin(version, nccl_standin(version))


# SSH to the nodes, and pyinfra's inventory entries
# -------------------------------------------------


def controller_key() -> Path:
    return CONTROLLER_DIR / "id_ed25519"


def known_hosts() -> Path:
    return CONTROLLER_DIR / "known_hosts"


def ssh_config() -> Path:
    return CONTROLLER_DIR / "ssh_config"


def sim_hosts(count: int = 2, shape: str = "spark") -> list[tuple[str, dict]]:
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
    """Serve the tiny model at HUB_URL (repo SIM_MODEL, revision SIM_REVISION) until the bed goes down."""
    repo = HUB_ROOT / SIM_MODEL / SIM_REVISION
    if not repo.exists():
        repo.parent.mkdir(parents=True, exist_ok=True)
        repo.symlink_to(build_tiny_model())
    token = hub_token_file()
    _secret(token)
    log_file = open(STATE / "hub.log", "a")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", MGMT_NS, sys.executable, "-m", "sparkbed.hub", "--root", str(HUB_ROOT),
         "--host", MGMT_GATEWAY, "--port", str(HUB_PORT), "--token-file", str(token)],
        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
        preexec_fn=lambda: _enter_own_cgroup("hub"),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    (STATE / "hub.pid").write_text(f"{proc.pid}\n")
    return proc.pid
