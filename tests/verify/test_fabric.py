"""The fabric port (deploys/prepare.py): both twins' addresses, MTU and link, jumbo frames end to end, RDMA bandwidth."""

import re
import shlex
from ipaddress import IPv4Interface

import pytest

from sparkinfra import perftest, roce


def test_fabric_address(node):
    iface = node.cluster.fabric.interface
    prefix = node.cluster.fabric.subnet.prefixlen
    addresses = node.host.check_output(f"ip -4 -o addr show dev {iface}")
    assert f"inet {node.node.fabric_ip}/{prefix} " in addresses, f"{node}: {addresses!r}"


def test_twin_has_its_own_address_and_none_of_the_fabric_subnet(node):
    """The port's other PCIe function has its own IPv4 (link-local by default), never one of the fabric
    subnet (two netdevs in one subnet break routing and NCCL's interface discovery)."""
    port, fabric = node.port(), node.cluster.fabric
    if not port.twin:
        pytest.skip(f"{fabric.interface} has no twin on {node}")
    wanted = fabric.twin_address(node.node.fabric_ip)
    addresses = node.host.check_output(f"ip -4 -o addr show dev {port.twin}")
    assert f"inet {wanted} " in addresses, f"{node}: twin {port.twin} lacks {wanted}: {addresses!r}"
    inside = [a for a in re.findall(r"inet (\S+)", addresses) if IPv4Interface(a).ip in fabric.subnet]
    assert not inside, f"{node}: twin {port.twin} holds {inside} of the fabric subnet {fabric.subnet}"


def test_fabric_mtu_on_both_twins(node):
    port = node.port()
    assert not port.problems, f"{node}: {port.problems}"
    mtus = {netdev: int(node.host.file(f"/sys/class/net/{netdev}/mtu").content_string) for netdev in port.netdevs}
    wrong = {netdev: mtu for netdev, mtu in mtus.items() if mtu != node.cluster.fabric.mtu}
    assert not wrong, f"{node}: MTU {wrong}, the fabric's is {node.cluster.fabric.mtu}"


def test_fabric_link_up_on_both_twins(node):
    states = {n: node.host.file(f"/sys/class/net/{n}/operstate").content_string.strip() for n in node.port().netdevs}
    assert all(state == "up" for state in states.values()), f"{node}: {states}"


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


def _rows(target) -> dict[str, str]:
    """The GID row NCCL uses on each of ``target``'s HCAs (its env's index, else each one's own)."""
    port, index = target.port(), target.nccl_env().get("NCCL_IB_GID_INDEX", "")
    tables = target.gid_tables(port)
    return {d: str(roce.used_row(tables[d] or [], netdev, index)) for d, netdev in port.hcas}


def test_fabric_bandwidth_head_to_each_worker(cluster, request):
    """Opt-in (``--fabric-bandwidth``): RDMA writes from the head to each worker, on every HCA (both
    twins) at once (perftest's ib_write_bw, each side at its HCA's own GID row), reach
    ``fabric_min_gbps`` together; a twin that is down, or carries under half of its twin's rate (one
    twin left out, a controller trained at x2), is named."""
    if not request.config.getoption("fabric_bandwidth"):
        pytest.skip("opt-in: --fabric-bandwidth")
    head = next(t for t in cluster if t.node.rank == 0)
    fabric, wanted = head.cluster.fabric, head.cluster.config.fabric_min_gbps
    missing = [str(t) for t in cluster if t.root("command -v ib_write_bw").rc != 0]
    assert not missing, f"perftest's ib_write_bw is not installed on {missing} (apt install perftest)"
    head_port, head_rows, figures = head.port(), _rows(head), {}
    for worker in (t for t in cluster if t.node.rank > 0):
        worker_port, worker_rows = worker.port(), _rows(worker)
        pairs = list(zip(head_port.devices, worker_port.devices))  # the fabric's HCA first, then the twin's
        assert len(pairs) == len(head_port.devices), f"{head} has HCAs {head_port.devices}, {worker} {worker_port.devices}"
        servers = " ".join(
            f"{perftest.command(w, fabric.rdma_port, worker_rows[w], perftest.BASE_PORT + i)} >/dev/null 2>&1 &"
            for i, (_, w) in enumerate(pairs)
        )
        worker.root(f"sh -c {shlex.quote(f'{servers} sleep 0')} </dev/null >/dev/null 2>&1")
        clients = " ".join(
            f"{perftest.command(h, fabric.rdma_port, head_rows[h], perftest.BASE_PORT + i, str(worker.node.fabric_ip))}"
            f" > $t/{h} 2>&1 &" for i, (h, _) in enumerate(pairs)
        )
        script = f"t=$(mktemp -d); sleep 1; {clients} wait; for f in $t/*; do echo \"=== $f\"; cat $f; done; rm -rf $t"
        out = head.root(f"sh -c {shlex.quote(script)}").stdout
        sections = out.split("=== ")[1:]
        outputs = {s.split("\n", 1)[0].rsplit("/", 1)[-1]: s for s in sections}
        per_hca = {h: perftest.average_gbps(outputs.get(h, "")) for h, _ in pairs}
        failed = {h: outputs.get(h, "(no output)")[-300:] for h, g in per_hca.items() if g is None}
        assert not failed, f"ib_write_bw {head} -> {worker} gave no result on {sorted(failed)}: {failed}"
        best = max(per_hca.values())
        half = {h: round(g, 1) for h, g in per_hca.items() if g < best / 2}
        assert not half, (f"{head} -> {worker}: {sorted(half)} carry under half of the other twin's "
                          f"{best:.1f} Gb/s: {half} (one twin left out of NCCL_IB_HCA, or trained at x2)")
        figures[str(worker)] = (sum(per_hca.values()), per_hca)
    print(f"fabric bandwidth from {head}: " + "; ".join(
        f"{w} {total:.1f} Gb/s ({', '.join(f'{d} {g:.1f}' for d, g in hcas.items())})" for w, (total, hcas) in figures.items()))
    slow = {w: round(total, 1) for w, (total, _) in figures.items() if total < wanted}
    assert not slow, f"RDMA write bandwidth below fabric_min_gbps ({wanted} Gb/s) from {head}: {slow}"
