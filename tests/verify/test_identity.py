"""Every node is reachable as its configured user, can become root, and is a distinct machine."""


def test_ssh_as_configured_user(node):
    assert node.host.check_output("id -un") == node.node.ssh_user


def test_becomes_root(node):
    assert node.root("id -u").stdout.strip() == "0"


def test_nodes_are_distinct_machines(cluster):
    ids = {t.node.name: t.host.file("/etc/machine-id").content_string.strip() for t in cluster}
    names = {t.node.name: t.host.check_output("hostname") for t in cluster}
    assert len(set(ids.values())) == len(ids), f"two inventory entries reach the same machine: {ids}"
    assert len(set(names.values())) == len(names), f"hostnames repeat: {names}"


def test_fabric_interface_present(node):
    iface = node.cluster.fabric.interface
    assert node.host.interface(iface).exists, f"{node}: no {iface}"
