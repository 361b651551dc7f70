"""The fabric port (deploys/prepare.py): address, MTU, link, and jumbo frames end to end."""

import shlex

import pytest

from sparkinfra import perftest


def test_fabric_address(node):
    iface = node.cluster.fabric.interface
    prefix = node.cluster.fabric.subnet.prefixlen
    addresses = node.host.check_output(f"ip -4 -o addr show dev {iface}")
    assert f"inet {node.node.fabric_ip}/{prefix} " in addresses, f"{node}: {addresses!r}"


def test_fabric_mtu(node):
    iface = node.cluster.fabric.interface
    mtu = int(node.host.file(f"/sys/class/net/{iface}/mtu").content_string)
    assert mtu == node.cluster.fabric.mtu


def test_fabric_link_up(node):
    iface = node.cluster.fabric.interface
    assert node.host.file(f"/sys/class/net/{iface}/operstate").content_string.strip() == "up"


def test_jumbo_frames_cross_the_fabric(link):
    """A don't-fragment ping of MTU-28 bytes (a full frame) reaches every peer."""
    src, dst = link
    size = src.cluster.fabric.mtu - 28
    result = src.host.run(f"ping -c 1 -W 2 -M do -s {size} {dst.node.fabric_ip}")
    assert result.rc == 0, f"{src} -> {dst} ({size} bytes, DF): rc {result.rc} {result.stdout}{result.stderr}"


def test_frames_past_the_mtu_do_not_cross(node):
    """One byte more, with don't-fragment, is refused by this node's own port (an MTU above the
    settings' would let it through): a property of the node, so one peer is enough."""
    peer = next((n for n in node.cluster.nodes if n.name != node.node.name), None)
    if peer is None:
        pytest.skip("a cluster of one node has no peer")
    size = node.cluster.fabric.mtu - 27
    result = node.host.run(f"ping -c 1 -W 0.3 -M do -s {size} {peer.fabric_ip}")
    said = result.stdout + result.stderr
    assert result.rc != 0 and ("message too long" in said or "Frag needed" in said), (
        f"{node} -> {peer.name} ({size} bytes, DF): rc {result.rc} {said}")


def test_fabric_bandwidth_head_to_each_worker(cluster, request):
    """Opt-in (``--fabric-bandwidth``): RDMA writes from the head to each worker, every HCA at once
    (perftest's ib_write_bw, each side at its own GID index), reach ``fabric_min_gbps`` together."""
    if not request.config.getoption("fabric_bandwidth"):
        pytest.skip("opt-in: --fabric-bandwidth")
    head = next(t for t in cluster if t.node.rank == 0)
    fabric, wanted = head.cluster.fabric, head.cluster.config.fabric_min_gbps
    missing = [str(t) for t in cluster if t.root("command -v ib_write_bw").rc != 0]
    assert not missing, f"perftest's ib_write_bw is not installed on {missing} (apt install perftest)"
    head_gid, figures = head.nccl_env().get("NCCL_IB_GID_INDEX", ""), {}
    for worker in (t for t in cluster if t.node.rank > 0):
        ports = [(device, perftest.BASE_PORT + i) for i, device in enumerate(fabric.rdma_devices)]
        worker_gid = worker.nccl_env().get("NCCL_IB_GID_INDEX", "")
        servers = " ".join(
            f"{perftest.command(d, fabric.rdma_port, worker_gid, p)} >/dev/null 2>&1 &" for d, p in ports
        )
        worker.root(f"sh -c {shlex.quote(f'{servers} sleep 0')} </dev/null >/dev/null 2>&1")
        clients = " ".join(
            f"{perftest.command(d, fabric.rdma_port, head_gid, p, str(worker.node.fabric_ip))} > $t/{d} 2>&1 &"
            for d, p in ports
        )
        script = f"t=$(mktemp -d); sleep 1; {clients} wait; for f in $t/*; do echo \"=== $f\"; cat $f; done; rm -rf $t"
        out = head.root(f"sh -c {shlex.quote(script)}").stdout
        sections = out.split("=== ")[1:]
        outputs = {s.split("\n", 1)[0].rsplit("/", 1)[-1]: s for s in sections}
        per_hca = {d: perftest.average_gbps(outputs.get(d, "")) for d in fabric.rdma_devices}
        failed = {d: outputs.get(d, "(no output)") for d, g in per_hca.items() if g is None}
        assert not failed, f"ib_write_bw {head} -> {worker} gave no result: {failed}"
        figures[str(worker)] = (sum(per_hca.values()), per_hca)
    print(f"fabric bandwidth from {head}: " + "; ".join(
        f"{w} {total:.1f} Gb/s ({', '.join(f'{d} {g:.1f}' for d, g in hcas.items())})" for w, (total, hcas) in figures.items()))
    slow = {w: round(total, 1) for w, (total, _) in figures.items() if total < wanted}
    assert not slow, f"RDMA write bandwidth below fabric_min_gbps ({wanted} Gb/s) from {head}: {slow}"
