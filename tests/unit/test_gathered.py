"""
Facts gathered once per run: hosts asking at the same time share one command, a fact is read again
once any operation has run a command on any host, and change detection never serves the run.
``ssh.no_delay`` sets TCP_NODELAY on a host's SSH socket.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import gevent
import pytest
from paramiko import SSHException
from pyinfra.api.state import StateStage

from sparkinfra import ssh
from sparkinfra.facts.reading import at_once, gathered, gathered_each
from sparkinfra.facts.stage import DockerImageId, SnapshotManifest


class Run:
    """What ``gathered`` reads of a pyinfra state: its stage and every host's operations."""

    def __init__(self) -> None:
        self.current_stage = StateStage.Execute
        self.ops: dict = {}
        self.config = None
        self.reading = self.most_reading = 0  # reads under way, over all hosts

    def complete(self, host, commands: int) -> None:
        """Record that an operation finished on ``host`` having run ``commands`` commands."""
        meta = SimpleNamespace(is_complete=lambda: True, executed=commands > 0)
        self.ops.setdefault(host, {})[f"op{len(self.ops.get(host, {}))}"] = SimpleNamespace(operation_meta=meta)


class Node:
    """A host whose facts take a while to come back, counting the commands it is asked for."""

    def __init__(self, name: str, run: Run, value="sha256:aaa") -> None:
        self.name, self.state, self.value = name, run, value
        self.commands: list[tuple] = []

    def get_fact(self, cls, **kwargs):
        self.commands.append((cls.__name__, kwargs))
        self.state.reading += 1
        self.state.most_reading = max(self.state.most_reading, self.state.reading)
        gevent.sleep(0.01)
        self.state.reading -= 1
        return self.value


def test_hosts_asking_at_once_share_one_command():
    run = Run()
    head = Node("spark-1", run)
    readers = [gevent.spawn(gathered, head, SnapshotManifest, repo_dir="/m", deep=False) for _ in range(8)]
    gevent.joinall(readers, raise_error=True)
    assert [r.value for r in readers] == ["sha256:aaa"] * 8
    assert head.commands == [("SnapshotManifest", {"repo_dir": "/m", "deep": False})]


def test_different_arguments_are_different_facts():
    head = Node("spark-1", Run())
    gathered(head, SnapshotManifest, repo_dir="/m", deep=False)
    gathered(head, SnapshotManifest, repo_dir="/m", deep=True)
    gathered(head, SnapshotManifest, repo_dir="/m", deep=False)
    assert len(head.commands) == 2


def test_a_command_on_any_host_means_reading_again():
    run = Run()
    head, worker = Node("spark-1", run), Node("spark-2", run)
    gathered(worker, DockerImageId, image="vllm-node")
    run.complete(head, commands=0)  # a no-op elsewhere changes nothing
    gathered(worker, DockerImageId, image="vllm-node")
    assert len(worker.commands) == 1
    run.complete(head, commands=1)  # the head streamed the image to this worker
    gathered(worker, DockerImageId, image="vllm-node")
    assert len(worker.commands) == 2


def test_change_detection_never_serves_the_run():
    run = Run()
    head = Node("spark-1", run)
    run.current_stage = StateStage.Prepare
    gathered(head, DockerImageId, image="vllm-node")
    run.current_stage = StateStage.Execute
    gathered(head, DockerImageId, image="vllm-node")
    assert len(head.commands) == 2


def test_a_failed_read_is_not_kept():
    head = Node("spark-1", Run())
    calls = []

    def flaky(cls, **kwargs):
        calls.append(cls)
        if len(calls) == 1:
            raise ConnectionError("channel closed")
        return "sha256:bbb"

    head.get_fact = flaky
    try:
        gathered(head, DockerImageId, image="vllm-node")
    except ConnectionError:
        pass
    else:
        raise AssertionError("the first read should fail")
    assert gathered(head, DockerImageId, image="vllm-node") == "sha256:bbb"


def test_gathered_each_reads_every_host_at_once_in_order():
    run = Run()
    nodes = [Node(f"spark-{i}", run, value=f"sha256:{i}") for i in range(1, 8)]
    assert gathered_each(nodes, DockerImageId, image="vllm-node") == [f"sha256:{i}" for i in range(1, 8)]
    assert run.most_reading == 7  # all under way together, not one after the other


def test_at_once_sets_the_context_to_each_host():
    from pyinfra import host as current_host

    run = Run()
    nodes = [Node(f"spark-{i}", run) for i in (1, 2)]
    names = at_once([(n, lambda: current_host.name, {}) for n in nodes])
    assert names == ["spark-1", "spark-2"]


def _host_with(sock):
    transport = SimpleNamespace(sock=sock)
    return SimpleNamespace(connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))


def test_no_delay_on_a_tcp_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert ssh.no_delay(_host_with(sock)) is True
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_no_delay_leaves_proxied_and_unconnected_hosts_alone():
    left, right = socket.socketpair()  # a proxy command's pipe, not TCP
    with left, right:
        assert ssh.no_delay(_host_with(left)) is False
    assert ssh.no_delay(SimpleNamespace(connector=SimpleNamespace(client=None))) is False


def test_a_connection_lost_mid_run_is_an_ssh_error_pyinfra_reports_on_the_host():
    """paramiko raises EOFError opening a session on a connection whose node went away; pyinfra
    catches SSHException (the host's error line, the host failed) but not EOFError (a traceback)."""
    calls = []

    def run_shell_command(command, **kwargs):
        calls.append(command)
        if command == "lost":
            raise EOFError()
        return True, ["ok"]

    host = SimpleNamespace(name="spark-1", connector=SimpleNamespace(run_shell_command=run_shell_command))
    ssh.lost_as_ssh_error(host)
    ssh.lost_as_ssh_error(host)  # once per connector, however often it connects
    assert host.connector.run_shell_command("true", _sudo=True) == (True, ["ok"])
    with pytest.raises(SSHException, match=r"^the connection to spark-1 closed \(EOFError\): it went away$"):
        host.connector.run_shell_command("lost")
    assert calls == ["true", "lost"]
