"""
The verify suite: testinfra checks of the state the deploys ensure, on every node of an inventory.

    pytest tests/verify --inventory inventory/pair.py [--data key=value ...]

The inventory is loaded through pyinfra's own loader (inventory file, ``group_data/``,
``--data``), so the checks see the same settings the deploy used. Tests take ``node``
(one per host), ``link`` (one per ordered pair of nodes of a cluster) or ``cluster``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import pytest
import testinfra

from sparkinfra import roce
from sparkinfra.facts.fabric import RdmaNetdevs, RoceGidTable
from sparkinfra.node.paths import NCCL_ENV_FILE
from sparkinfra.run import load_files
from sparkinfra.settings import Cluster, Node


def pytest_addoption(parser):
    group = parser.getgroup("sparkinfra")
    group.addoption("--inventory", help="pyinfra inventory file, e.g. inventory/pair.py")
    group.addoption(
        "--data", action="append", default=[], metavar="KEY=VALUE",
        help="override data, as pyinfra's --data",
    )
    group.addoption(
        "--deep", action="store_true", help="compare sha256 of every staged file, not only sizes"
    )
    group.addoption(
        "--fabric-bandwidth", action="store_true",
        help="measure RDMA write bandwidth (perftest's ib_write_bw) from the head to each worker",
    )


@dataclass
class Target:
    """One node under test: its settings, its cluster and a testinfra host (as its SSH user)."""

    node: Node
    cluster: Cluster
    host: testinfra.host.Host
    sudo: bool

    def __str__(self) -> str:
        return self.node.name

    def fact(self, fact_cls, **kwargs):
        """A sparkinfra/pyinfra fact read on this node (as root), as the deploys read it."""
        command = fact_cls().command(**kwargs)
        raw = command.get_raw_value() if hasattr(command, "get_raw_value") else command
        return fact_cls().process(self.root(raw).stdout.splitlines())

    def port(self) -> roce.Port:
        """This node's fabric port as prepare reads it: its twin and HCAs (ibdev2netdev's sysfs)."""
        return roce.port_of(self.cluster.fabric, self.fact(RdmaNetdevs))

    def gid_tables(self, port: roce.Port) -> dict[str, list[dict] | None]:
        """Each HCA's GID table, read now."""
        return {d: self.fact(RoceGidTable, device=d, port=self.cluster.fabric.rdma_port) for d in port.devices}

    def nccl_env(self) -> dict[str, str]:
        """The node's NCCL env file (``/etc/sparkinfra/nccl.env``) as variables."""
        out = self.root(f"cat {NCCL_ENV_FILE}")
        assert out.rc == 0, f"{self}: {out.stderr}"
        return dict(line.split("=", 1) for line in out.stdout.splitlines() if line and not line.startswith("#"))

    def root(self, command: str, *args) -> testinfra.backend.base.CommandResult:
        """Run a command as root (through sudo when the node's user is not root)."""
        if self.sudo:
            with self.host.sudo():
                return self.host.run(command, *args)
        return self.host.run(command, *args)


def _load(config):
    path = config.getoption("inventory")
    if not path:
        raise pytest.UsageError("tests/verify needs --inventory (e.g. --inventory inventory/pair.py)")
    return load_files(path, config.getoption("data"))


def _testinfra_host(data) -> testinfra.host.Host:
    hostname = data.get("ssh_hostname")
    user = data.get("ssh_user")
    port = data.get("ssh_port")
    spec = f"ssh://{user + '@' if user else ''}{hostname}{':' + str(port) if port else ''}"
    extra = ["-o BatchMode=yes"]
    if data.get("ssh_known_hosts_file"):
        extra.append(f"-o UserKnownHostsFile={shlex.quote(data.get('ssh_known_hosts_file'))}")
    strict = data.get("ssh_strict_host_key_checking")
    if strict is not None:
        extra.append(f"-o StrictHostKeyChecking={strict}")
    if data.get("ssh_key"):
        extra.append("-o IdentitiesOnly=yes")
    # One multiplexed connection per node for the whole run; closed in pytest_unconfigure.
    # testinfra %-formats the control path
    kwargs = {"ssh_extra_args": " ".join(extra), "controlpersist": 60, "controlpath": _CONTROL_PATH.replace("%", "%%")}
    if data.get("ssh_key"):
        kwargs["ssh_identity_file"] = data.get("ssh_key")
    if data.get("ssh_config_file"):
        kwargs["ssh_config"] = data.get("ssh_config_file")
    return testinfra.get_host(spec, **kwargs)


_CONTROL_DIR = tempfile.mkdtemp(prefix="sparkinfra-verify-")
_CONTROL_PATH = os.path.join(_CONTROL_DIR, "%C")


def pytest_configure(config):
    config._sparkinfra = None


def pytest_unconfigure(config):
    """Close the SSH master connections this run opened, and their sockets' folder."""
    for target in config._sparkinfra or ():
        spec = target.host.backend.host  # testinfra's parsed ssh://user@name:port
        argv = ["ssh", "-o", f"ControlPath={_CONTROL_PATH}", "-O", "exit"]
        if spec.user:
            argv += ["-o", f"User={spec.user}"]
        if spec.port:
            argv += ["-o", f"Port={spec.port}"]
        subprocess.run(argv + [spec.name], capture_output=True, timeout=10)
    shutil.rmtree(_CONTROL_DIR, ignore_errors=True)


def _targets(config) -> list[Target]:
    if config._sparkinfra is None:
        inventory, settings = _load(config)
        targets = []
        for cluster in settings.clusters.values():
            for node in cluster.nodes:
                data = inventory.get_host(node.name).data
                sudo = bool(data.get("_sudo")) and node.ssh_user != "root"
                targets.append(Target(node, cluster, _testinfra_host(data), sudo))
        config._sparkinfra = targets
    return config._sparkinfra


def pytest_generate_tests(metafunc):
    if not {"node", "link", "cluster"} & set(metafunc.fixturenames):
        return
    targets = _targets(metafunc.config)
    if "node" in metafunc.fixturenames:
        metafunc.parametrize("node", targets, ids=[t.node.name for t in targets])
    if "link" in metafunc.fixturenames:
        links = [
            (a, b) for a in targets for b in targets if a is not b and a.cluster.name == b.cluster.name
        ]
        metafunc.parametrize("link", links, ids=[f"{a}->{b}" for a, b in links])
    if "cluster" in metafunc.fixturenames:
        clusters = {t.cluster.name: [x for x in targets if x.cluster.name == t.cluster.name] for t in targets}
        metafunc.parametrize("cluster", list(clusters.values()), ids=list(clusters))
