"""
Facts gathered once per run: hosts asking at the same time share one command, a fact is read again
once any operation has run a command on any host, and change detection never serves the run.
``ssh.no_delay`` sets TCP_NODELAY on a host's SSH socket.
"""

from __future__ import annotations

import socket
import subprocess
from types import SimpleNamespace

import gevent
import pytest
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.state import StateStage
from pyinfra.facts.files import FileContents
from spark_cluster import load_cluster

from sparkinfra import reads, ssh
from sparkinfra.facts.files import FileState
from sparkinfra.facts.reading import (
    Together,
    at_once,
    gathered,
    gathered_each,
    read_ahead,
    split_together,
)
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


# read_ahead: the reads a deploy declares are made in one command, run here by a real shell


class Shell(Node):
    """A node whose ``Together`` command runs in this machine's ``sh``; any other fact is a
    command of its own, answered with ``value``."""

    def get_fact(self, cls, **kwargs):
        if cls is not Together:
            return super().get_fact(cls, **kwargs)
        self.commands.append(("Together", [type(fact).__name__ for fact, _ in kwargs["reads"]]))
        command = Together().command(**kwargs).get_raw_value()
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        return Together().process(out.splitlines())


class Echo(FactBase):
    """Prints ``text`` as it is (no newline added)."""

    def command(self, text: str):
        return StringCommand("printf", "%s", QuoteString(text))

    def process(self, output):
        return output


class Failing(FactBase):
    def command(self):
        return "echo half; exit 3"


class NeedsTool(FactBase):
    def requires_command(self, *args, **kwargs):
        return "no-such-tool-here"

    def command(self):
        return "no-such-tool-here --version"


def test_declared_reads_are_one_command_and_each_gets_its_own_output(tmp_path):
    (tmp_path / "f").write_text("x\n")
    node = Shell("spark-2", Run())
    read_ahead(node, [(FileContents, {"path": str(tmp_path / "f")}), (FileContents, {"path": str(tmp_path / "no")}),
                      (Echo, {"text": "a\nb"}), (Echo, {"text": "no newline at the end"}),
                      (Echo, {"text": ""}), (FileState, {"path": str(tmp_path / "f")})])
    assert gathered(node, Echo, text="no newline at the end") == ["no newline at the end"]
    assert gathered(node, Echo, text="a\nb") == ["a", "b"]
    assert gathered(node, Echo, text="") is None  # no output: the fact's default, as pyinfra gives
    assert gathered(node, FileState, path=str(tmp_path / "f"))["kind"] == "file"
    assert gathered(node, FileContents, path=str(tmp_path / "f")) == ["x"]
    assert gathered(node, FileContents, path=str(tmp_path / "no")) is None  # read by the instance that ran it
    assert node.commands == [("Together", ["FileContents", "FileContents", "Echo", "Echo", "Echo", "FileState"])]


def test_a_read_the_batch_cannot_answer_is_read_alone():
    node = Shell("spark-2", Run(), value="alone")
    read_ahead(node, [(Failing, {}), (NeedsTool, {}), (Echo, {"text": "ok"})])
    assert gathered(node, Echo, text="ok") == ["ok"]
    assert gathered(node, Failing) == "alone"  # pyinfra's own read says what is wrong
    assert gathered(node, NeedsTool) == "alone"
    assert [c[0] for c in node.commands] == ["Together", "Failing", "NeedsTool"]


def test_reads_after_a_change_or_not_declared_are_alone():
    run = Run()
    head, worker = Shell("spark-1", run), Shell("spark-2", run, value="alone")
    read_ahead(worker, [(Echo, {"text": "a"}), (Echo, {"text": "b"})])
    assert gathered(worker, Echo, text="other") == "alone"  # not declared: no batch
    run.complete(head, commands=1)
    assert gathered(worker, Echo, text="a") == "alone"  # something changed: read afresh, alone
    assert [c[0] for c in worker.commands] == ["Echo", "Echo"]


def test_hosts_waiting_for_a_declared_read_share_the_batch():
    run = Run()
    head = Shell("spark-1", run)
    read_ahead(head, [(Echo, {"text": "manifest"}), (Echo, {"text": "image"})])
    readers = [gevent.spawn(gathered, head, Echo, text="manifest") for _ in range(7)]
    gevent.joinall(readers, raise_error=True)
    assert [r.value for r in readers] == [["manifest"]] * 7
    assert gathered(head, Echo, text="image") == ["image"]
    assert [c[0] for c in head.commands] == ["Together"]


def test_split_together_refuses_output_cut_short():
    assert split_together([]) is None
    assert split_together(["half a line"]) is None
    nonce = "0123456789abcdef"
    assert split_together([f"{nonce} 0 0", "x", f"y{nonce} 1 2"]) == [(0, []), (2, ["x", "y"])]



def test_a_batch_that_fails_leaves_each_read_to_itself():
    node = Shell("spark-2", Run(), value="alone")
    original = node.get_fact

    def broken(cls, **kwargs):
        if cls is Together:
            node.commands.append(("Together", "lost"))
            raise ConnectionError("channel closed")
        return original(cls, **kwargs)

    node.get_fact = broken
    read_ahead(node, [(Echo, {"text": "a"}), (Echo, {"text": "b"})])
    readers = [gevent.spawn(gathered, node, Echo, text="b") for _ in range(3)]
    assert gathered(node, Echo, text="a") == "alone"
    gevent.joinall(readers, raise_error=True)
    assert [r.value for r in readers] == ["alone"] * 3
    assert [c[0] for c in node.commands] == ["Together", "Echo", "Echo"]  # b read once, shared


# sparkinfra.reads: what each deploy declares builds one valid command on every node


@pytest.mark.parametrize("deep", [False, True])
def test_declared_reads_build_one_command_for_head_and_worker(tmp_path, deep):
    cluster = load_cluster(tmp_path, {"model": "org/target", "stage_verify": "deep" if deep else "size"})
    for node in cluster.nodes:
        declared = (reads.prepare_reads(cluster, node.name) + reads.stage_reads(cluster, node.name)
                    + reads.lane_reads(cluster, node.name, "tiny", "vllm-node:1", start=node == cluster.head))
        command = Together().command(reads=tuple((cls(), kwargs) for cls, kwargs in declared)).get_raw_value()
        assert command.count("echo ") >= len(declared), node.name
        names = [cls.__name__ for cls, _ in declared]
        assert ("AuthorizedKeys" in names) == (node != cluster.head), names
        assert names.count("SnapshotManifest") == (0 if deep and node != cluster.head else 1), names
        assert ("SystemdEnabled" in names) and names.count("FileDigest") == (node == cluster.head), names
