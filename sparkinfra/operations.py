"""
Operations: each ensures one piece of node state, and yields commands only when the
fact says the state differs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

from pyinfra import context, host, logger
from pyinfra.api import (
    FileUploadCommand,
    FunctionCommand,
    OperationError,
    QuoteString,
    StringCommand,
    operation,
)
from pyinfra.api.state import StateStage
from pyinfra.api.util import get_file_sha1, get_template
from pyinfra.facts.files import Block, Directory, File, FileContents, Sha256File
from pyinfra.facts.server import Home
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import files
from pyinfra.operations.util.files import chmod, chown, generate_color_diff

from . import scripts, serving, stage
from .facts import (
    AuthorizedKeys,
    DockerContainer,
    DockerImageId,
    FabricLink,
    FileDigest,
    FileState,
    LaneStatus,
    LaneUnits,
    NcclVersion,
    NetworkConfigBackend,
    RoceGidTable,
    SnapshotManifest,
    _snapshot_tool_command,
    gathered,
    gathered_each,
    roce_v2_index,
)
from .mesh import HOST_KEY

FABRIC_NETPLAN = "/etc/netplan/60-sparkinfra-fabric.yaml"  # where netplan is installed (DGX OS)
FABRIC_UNIT = "sparkinfra-fabric.service"  # elsewhere


def render(template: str, **values) -> str:
    """
    The text of ``templates/<template>`` rendered with ``values``, by the same Jinja2 set-up as
    pyinfra's ``files.template``.
    """
    return get_template(str(TEMPLATES / template)).render(values)


@operation()
def file_content(path: str, content: str | None = None, src: str | None = None,
                 user: str = "root", group: str = "root", mode: str = "644"):
    """
    Ensure ``path`` holds ``content`` with this owner and mode, read with one command (pyinfra's
    ``files.put`` asks three facts per file: most of a node's round trips in a no-op converge).
    Uploads only when the content differs; with ``--diff``, prints the change as a unified diff.

    + path: the file on the node (its folder is made if missing)
    + content: the text it must hold
    + src: or a file on the controller whose bytes it must hold (a library: no diff is printed)
    + user, group, mode: its owner and mode (octal, ``"600"``)
    """
    now = gathered(host, FileState, path=path)
    if now["kind"] == "other":
        yield from _refuse(f"{host.name}: {path} is not a regular file; remove it, sparkinfra writes a file there")
        return
    # pyinfra's own digest: a controller file is hashed once per run, not once per host.
    wanted_sha1 = get_file_sha1(src if src is not None else io.StringIO(content))
    if now["kind"] == "file" and now["sha1"] == wanted_sha1:
        if now["user"] != user or now["group"] != group:
            yield chown(path, user, group)
        if int(now["mode"], 8) != int(mode, 8):
            yield chmod(path, mode)
        host.noop(f"{path} holds the wanted content")
        return
    if context.state.config.DIFF and src is None:
        before = (host.get_fact(FileContents, path=path) or []) if now["kind"] == "file" else []
        host.log(f"Will {'modify' if now['kind'] == 'file' else 'create'} {path}", logger.info)
        for line in generate_color_diff([line + "\n" for line in before], content.splitlines(keepends=True)):
            logger.info("  %s", line)
        logger.info("")
    if not now["parent"]:
        yield StringCommand("mkdir", "-p", QuoteString(os.path.dirname(path)))
    source = src if src is not None else io.StringIO(content)
    yield FileUploadCommand(source, path, remote_temp_filename=host.get_temp_filename(path))
    yield chown(path, user, group)
    yield chmod(path, mode)


@operation()
def text_block(path: str, content: str, marker: str):
    """
    Ensure ``path`` holds ``content`` between ``marker``'s BEGIN and END lines, the rest of the
    file as it is: pyinfra's ``files.block``, called only when the block differs (it reads its
    fact twice and warns that it is beta on every run).

    + path: the file
    + content: the block's lines
    + marker: the markers' text, ``{mark}`` standing for BEGIN or END
    """
    if gathered(host, Block, path=path, marker=marker, begin=None, end=None) == content.split("\n"):
        host.noop(f"{path} holds the block")
        return
    yield from files.block._inner(path=path, content=content, marker=marker)


def _link(interface: str) -> dict:
    link = gathered(host, FabricLink, interface=interface)
    if link is None:
        raise OperationError(f"{host.name}: fabric interface {interface} does not exist")
    return link


@operation()
def fabric_link(interface: str, mtu: int, up: bool = True):
    """
    Ensure the fabric interface has the MTU and is administratively up.

    + interface: the fabric interface (``enp1s0f0np0``)
    + mtu: the MTU it must have (4200 on a Spark fabric: RoCE then runs at 4096)
    + up: whether the link must be up; a link already right is never bounced
    """
    link = _link(interface)
    if link["mtu"] != mtu:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "mtu", str(mtu))
    if up and not link["admin_up"]:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "up")
    elif not up and link["admin_up"]:
        yield StringCommand("ip", "link", "set", "dev", QuoteString(interface), "down")
    if link["mtu"] == mtu and link["admin_up"] == up:
        host.noop(f"{interface} has MTU {mtu} and is {'up' if up else 'down'}")


@operation()
def fabric_address(interface: str, address: str, present: bool = True):
    """
    Ensure the fabric interface carries an IPv4 address (at runtime).

    + interface: the fabric interface
    + address: the address with its prefix, ``192.168.192.1/24``
    + present: whether it must be there; other addresses of the same subnet (a renumbered or
      mistyped node) are removed when ``present``, since two would confuse GID and NCCL
    """
    wanted = IPv4Interface(address)
    link = _link(interface)
    current = [IPv4Interface(a) for a in link["ipv4"]]
    subnet: IPv4Network = wanted.network
    changed = False
    for other in current:
        if other == wanted:
            continue
        if present and (other.ip == wanted.ip or other.ip in subnet):
            changed = True
            yield StringCommand("ip", "addr", "del", str(other), "dev", QuoteString(interface))
    if present and wanted not in current:
        changed = True
        yield StringCommand("ip", "addr", "add", str(wanted), "dev", QuoteString(interface))
    if not present and wanted in current:
        changed = True
        yield StringCommand("ip", "addr", "del", str(wanted), "dev", QuoteString(interface))
    if not changed:
        host.noop(f"{interface} {'has' if present else 'does not have'} {wanted}")


TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


def _preparing() -> bool:
    """True while pyinfra only detects changes (its prepare stage), before anything runs."""
    return host.state.current_stage != StateStage.Execute


def _refuse(message: str):
    """Stop this operation on this host with ``message``: an error while preparing, a failing
    command (its message in pyinfra's output, no traceback) while running."""
    if _preparing():
        raise OperationError(message)
    yield StringCommand("sh", "-c", QuoteString(f"echo {shlex.quote(message)} >&2; exit 1"))


@operation()
def service_enabled(service: str, enabled: bool = True):
    """
    Ensure a systemd unit is enabled (starts at boot) or not; nothing is started or stopped now.
    One fact (``SystemdEnabled``); pyinfra's ``systemd.service`` also reads ``SystemdStatus``.

    + service: the unit, ``sparkinfra-fabric.service``
    + enabled: whether it starts at boot
    """
    if bool(gathered(host, SystemdEnabled, services=service).get(service)) == enabled:
        host.noop(f"{service} is {'enabled' if enabled else 'disabled'}")
        return
    yield StringCommand("systemctl", "enable" if enabled else "disable", QuoteString(service))


@operation()
def fabric_persisted(interface: str, address: str, mtu: int, present: bool = True):
    """
    Ensure the fabric address and MTU come back at boot: a netplan file where netplan is
    installed (DGX OS), else a oneshot unit that sets them before the network is up. Nothing
    is applied now (the runtime operations do that, without bouncing the link).

    + interface: the fabric interface
    + address: the address with its prefix
    + mtu: the MTU
    + present: whether the boot-time config must exist
    """
    if gathered(host, NetworkConfigBackend) == "netplan":
        dest = FABRIC_NETPLAN
        if not present:
            yield from files.file._inner(path=dest, present=False)
            return
        yield from file_content._inner(
            path=dest, mode="600",  # netplan refuses world-readable files
            content=render("etc/netplan/60-sparkinfra-fabric.yaml.j2", interface=interface, address=address, mtu=mtu),
        )
        return
    unit = FABRIC_UNIT
    dest = f"/etc/systemd/system/{unit}"
    if not present:
        yield from service_enabled._inner(service=unit, enabled=False)
        yield from files.file._inner(path=dest, present=False)
        return
    changed = False
    for command in file_content._inner(
        path=dest, mode="644",
        content=render("etc/systemd/system/sparkinfra-fabric.service.j2", interface=interface, address=address, mtu=mtu),
    ):
        changed = True
        yield command
    if changed:
        yield StringCommand("systemctl", "daemon-reload")
    yield from service_enabled._inner(service=unit, enabled=True)


@operation()
def nccl_environment(
    path: str,
    variables: dict[str, str],
    overrides: dict[str, str | None],
    rdma_device: str,
    rdma_port: int,
    fabric_ip: str,
    interface: str,
):
    """
    Ensure the node's NCCL env file (root, 0600) holds ``variables`` plus this node's RoCE
    GID index, read from the port's GID table now (it differs per node).

    + path: the env file (``EnvironmentFile=`` of the lane units)
    + variables: everything but the GID index, decided by the caller
    + overrides: applied last; a ``None`` value removes the variable
    + rdma_device, rdma_port: where to read the GID table
    + fabric_ip, interface: the RoCE v2 row that carries this IPv4 on this netdev is the one
    """
    rows = gathered(host, RoceGidTable, device=rdma_device, port=rdma_port)
    index = roce_v2_index(rows or [], fabric_ip, interface)
    if index is None:
        if _preparing():
            # The fabric address may only be set by an earlier operation of this run.
            yield StringCommand("echo", f"GID index of {fabric_ip} is read once the address is set")
            return
        table = (
            "; ".join(f"{r['index']}: {r['gid']} {r['type']} {r['ndev']}" for r in rows)
            if rows else "no table" if rows is None else "no populated rows"
        )
        yield from _refuse(
            f"{host.name}: {rdma_device} port {rdma_port} has no RoCE v2 GID for {fabric_ip} "
            f"on {interface}; the table holds: {table}"
        )
        return
    env = dict(variables)
    env["NCCL_IB_GID_INDEX"] = str(index)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    yield from file_content._inner(
        path=path, mode="600", content=render("etc/sparkinfra/nccl.env.j2", variables=sorted(env.items())),
    )


@operation()
def nccl_pinned(path: str, version: str, upload: str = ""):
    """
    Ensure the pinned libnccl is on the node and reports the wanted version.

    + path: the library on the node (``VLLM_NCCL_SO_PATH``/``LD_PRELOAD`` point at it)
    + version: what ``ncclGetVersion`` must report, ``2.30.7``
    + upload: a controller file to place at ``path`` first; empty: it must already be there
    """
    uploaded = False
    if upload:
        for command in file_content._inner(path=path, src=upload, mode="644"):
            uploaded = True
            yield command
    elif not gathered(host, File, path=path):
        yield from _refuse(f"{host.name}: pinned NCCL {path} is missing (set nccl_library_upload?)")
        return
    if _preparing():
        return
    # After an upload above, read afresh (gathered() is for reads before an operation yields).
    found = host.get_fact(NcclVersion, path=path) if uploaded else gathered(host, NcclVersion, path=path)
    if found != version:
        yield from _refuse(f"{host.name}: {path} reports NCCL {found}, settings want {version}")
        return
    host.noop(f"{path} reports NCCL {found}")


@operation()
def ssh_key_present(path: str, comment: str):
    """
    Ensure an ed25519 key pair exists (generated here; the private key never leaves the host).

    + path: the private key; the public key is ``path + ".pub"``
    + comment: the key's comment
    """
    if gathered(host, File, path=path) and gathered(host, File, path=f"{path}.pub"):
        host.noop(f"{path} exists")
        return
    yield StringCommand("mkdir", "-p", "-m", "700", QuoteString(str(Path(path).parent)))
    yield StringCommand("rm", "-f", QuoteString(path), QuoteString(f"{path}.pub"))
    yield StringCommand("ssh-keygen", "-q", "-t", "ed25519", "-N", "''", "-C", QuoteString(comment), "-f", QuoteString(path))


@operation()
def ssh_key_authorized(user: str, key_host, key_path: str, from_ip: str, present: bool = True):
    """
    Ensure another host's public key is authorized for ``user`` here, from ``from_ip`` only.

    + user: the local user the key logs in as
    + key_host: the pyinfra host holding the key (read when this operation runs)
    + key_path: the public key file on ``key_host``
    + from_ip: the only source address the key is accepted from (the head's fabric IP)
    + present: whether it must be authorized; ``False`` removes every line holding the key (found
      by the key itself: run it before the key goes from ``key_host``)
    """
    pubkey = (gathered(key_host, FileContents, path=key_path) or [""])[0].strip()
    if not pubkey and not present:
        host.noop(f"no key {key_path} on {key_host.name}: none of it to remove")
        return
    if not pubkey:
        if _preparing():
            yield StringCommand("echo", f"the key {key_path} of {key_host.name} is generated first")
            return
        yield from _refuse(f"{host.name}: no public key {key_path} on {key_host.name}")
        return
    line = f'from="{from_ip}" {pubkey}'
    now = gathered(host, AuthorizedKeys, user=user) if present else None
    if now and now["ssh_dir"] == ["directory", user, user, "700"] and now["file"] == ["file", user, user, "600"]:
        holding = [held for held in now["lines"] if pubkey.split()[1] in held]
        if holding and all(held == line for held in holding):
            host.noop(f"{key_host.name}'s key is authorized for {user} from {from_ip}")
            return
    home = gathered(host, Home, user=user)
    # grep/sed read a basic regex: the key's base64 '+' is literal there (re.escape's '\+' is not).
    match = ".*" + re.sub(r"([\\.\[\]*^$])", r"\\\1", pubkey.split()[1]) + ".*"
    if not present:  # nothing created on the way (no .ssh folder, no empty file)
        yield from files.line._inner(path=f"{home}/.ssh/authorized_keys", line=match, present=False)
        return
    yield from files.directory._inner(path=f"{home}/.ssh", user=user, group=user, mode="700")
    yield from files.line._inner(
        path=f"{home}/.ssh/authorized_keys",
        line=match,
        replace=line,
        present=present,
    )
    yield from files.file._inner(path=f"{home}/.ssh/authorized_keys", user=user, group=user, mode="600")


@operation()
def known_hosts(path: str, workers: list):
    """
    Ensure the head's known_hosts for the fabric holds each worker's ed25519 host key under its
    fabric IP, read from the worker itself when this operation runs.

    + path: the known_hosts file
    + workers: ``(pyinfra host, fabric IP)`` pairs
    """
    contents = gathered_each([w for w, _ in workers], FileContents, path=HOST_KEY)
    lines = []
    for (worker, ip), content in zip(workers, contents):
        key = " ".join(" ".join(content or []).split()[:2])
        if not key:
            yield from _refuse(f"{worker.name}: no SSH host key at {HOST_KEY}")
            return
        lines.append(f"{ip} {key}\n")
    yield from file_content._inner(path=path, content="".join(lines), mode="600")


@operation()
def stale_container_absent(container: str):
    """
    Ensure no stopped container holds a lane's container name (an aborted launch leaves a
    placeholder that eats the next launch's exec script).

    + container: the container name (``vllm_node``)
    """
    state = gathered(host, DockerContainer, container=container)
    if state is None or state["running"]:
        host.noop(f"no stale container {container}")
        return
    yield StringCommand("docker", "rm", "-f", QuoteString(container))


@operation()
def container_absent(container: str):
    """
    Ensure no container, running or not, holds this name (teardown).

    + container: the container name
    """
    if gathered(host, DockerContainer, container=container) is None:
        host.noop(f"no container {container}")
        return
    yield StringCommand("docker", "rm", "-f", QuoteString(container))


@operation(is_idempotent=False)
def page_caches_dropped():
    """
    Drop the page cache (run it right before a lane starts, with ``_if=``: not on every converge).
    """
    yield "sync"
    yield "echo 3 > /proc/sys/vm/drop_caches"


# Staging
# -------


@operation()
def image_present(image: str, image_id: str = "", tarball: str = "", build: str = ""):
    """
    Ensure the image is on this host (the head): loaded from ``tarball`` or built by ``build``
    when missing, and with ``image_id`` when one is given.

    + image: name:tag
    + image_id: the ID it must have (``sha256:...``); empty: any
    + tarball: a ``docker save`` tarball on this host to load when the image is missing
    + build: a shell command on this host that builds the image when it is missing
    """
    current = gathered(host, DockerImageId, image=image)
    if current is None:
        if tarball:
            yield StringCommand("docker", "load", "-i", QuoteString(tarball))
        elif build:
            yield StringCommand("sh", "-c", QuoteString(build))
        else:
            yield from _refuse(f"{host.name}: image {image} is missing; set image_tarball or image_build")
            return
        if image_id:
            check = (
                f"got=$(docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}); "
                f"[ \"$got\" = {shlex.quote(image_id)} ] || "
                f"{{ echo \"{host.name}: {image} is $got, settings want {image_id}\" >&2; exit 1; }}"
            )
            yield StringCommand("sh", "-c", QuoteString(check))
        return
    if image_id and current != image_id:
        yield from _refuse(f"{host.name}: image {image} is {current}, settings want {image_id}")
        return
    host.noop(f"{image} is {current}")


@operation()
def image_on_workers(image: str, workers: list):
    """
    Ensure every worker has the head's image ID: only workers whose ID differs receive it,
    streamed from this host (the head) over the fabric, all at once; 0 bytes move otherwise.

    + image: name:tag
    + workers: ``(pyinfra host, fabric IP)`` of each worker (reached through the SSH mesh)
    """
    head_id = gathered(host, DockerImageId, image=image)
    if head_id is None:
        if _preparing():
            yield StringCommand("echo", f"{image} reaches the workers once it is on the head")
            return
        yield from _refuse(f"{host.name}: {image} is not on the head")
        return
    ids = gathered_each([w for w, _ in workers], DockerImageId, image=image)
    behind = [(w, ip) for (w, ip), wid in zip(workers, ids) if wid != head_id]
    if not behind:
        host.noop(f"every worker has {image} {head_id[:19]}")
        return
    script = stage.image_fanout_script(image, head_id, [(w.name, ipaddr) for w, ipaddr in behind])
    yield StringCommand("bash", "-c", QuoteString(script))


@operation()
def snapshot_manifest(repo_dir: str):
    """
    Ensure the snapshot's manifest (path, size, sha256 of every file) is current on this host;
    only files whose size or mtime changed are hashed again.

    + repo_dir: the repository's folder in the HF cache
    """
    state = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    if not state.get("exists"):
        if _preparing():
            yield StringCommand("echo", f"manifest of {repo_dir} once the snapshot is there")
            return
        yield from _refuse(f"{host.name}: no snapshot at {repo_dir}")
        return
    if not state["stale"]:
        host.noop(f"manifest of {repo_dir}: {state['files']} files, {state['bytes']} bytes")
        return
    yield _snapshot_tool_command("manifest", repo_dir, "--write")


@operation()
def snapshot_on_workers(repo_dir: str, workers: list, bind_ip: str, port: int, streams: int, deep: bool = False):
    """
    Ensure every worker's copy of a snapshot matches this host's (the head's) manifest: the
    workers whose manifest digest differs pull only missing, short or differing files, in
    parallel streams, from a read-only rsync daemon the head runs on its fabric address for the
    transfer only.

    + repo_dir: the repository's folder in the HF cache (the same path on every node)
    + workers: ``(pyinfra host, fabric IP)`` of each worker (reached through the SSH mesh)
    + bind_ip, port: where the head's daemon listens during the transfer
    + streams: parallel rsync streams per worker
    + deep: hash every file on the workers, not only those whose size or mtime changed
    """
    mine = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    if not mine.get("exists") or mine.get("stale"):
        if _preparing():
            yield StringCommand("echo", f"{repo_dir} reaches the workers once its manifest is made")
            return
        yield from _refuse(f"{host.name}: no current manifest for {repo_dir}")
        return
    theirs = gathered_each([w for w, _ in workers], SnapshotManifest, repo_dir=repo_dir, deep=deep)
    behind = [ipaddr for (_, ipaddr), m in zip(workers, theirs) if (m or {}).get("digest") != mine["digest"]]
    if not behind:
        host.noop(f"every worker matches the manifest of {repo_dir}")
        return
    script = stage.head_transfer_script(repo_dir, behind, bind_ip, port, streams, deep)
    yield StringCommand("bash", "-c", QuoteString(script))


@operation()
def snapshot_matches(repo_dir: str, head, deep: bool = False):
    """
    Ensure this host's copy of a snapshot matches the head's manifest (checked, never changed
    here: the head stages it). A mismatch after staging is an error naming the files.

    + repo_dir: the repository's folder in the HF cache
    + head: the pyinfra host holding the manifest
    + deep: hash every file, not only those whose size or mtime changed
    """
    if _preparing():
        return
    wanted = gathered(head, SnapshotManifest, repo_dir=repo_dir, deep=False) or {}
    mine = gathered(host, SnapshotManifest, repo_dir=repo_dir, deep=deep) or {}
    if wanted.get("digest") and mine.get("digest") == wanted["digest"]:
        host.noop(f"{repo_dir} matches the head's manifest ({mine['files']} files)")
        return
    # Name the files: compare against the head's manifest, placed here for that.
    content = "\n".join(gathered(head, FileContents, path=f"{repo_dir}/{stage.MANIFEST}") or [])
    check = f"/run/sparkinfra/{stage.MANIFEST}.{host.name}"
    yield from files.put._inner(src=io.StringIO(content), dest=check, mode="600")
    yield StringCommand(
        "sh", "-c", QuoteString(
            f"python3 -c {shlex.quote(stage.tool_source())} compare {shlex.quote(repo_dir)} {check}"
            + (" --deep" if deep else "")
            + f" | python3 -c {shlex.quote(_MISMATCH)} {shlex.quote(host.name)} {shlex.quote(repo_dir)}"
        ),
    )


_MISMATCH = (
    "import json, sys; d = json.load(sys.stdin); "
    "bad = d['missing'] + d['shorter'] + d['differ'] + d['links']; "
    "print(f'{sys.argv[1]}: {sys.argv[2]} does not match the head manifest: {bad[:20]}', file=sys.stderr); "
    "sys.exit(1)"
)


@operation()
def snapshot_downloaded(repo: str, revision: str, cache_dir: str, image: str, token_env: str = "HF_TOKEN",
                        endpoint: str = ""):
    """
    Ensure a model snapshot is in this host's HF cache, downloaded once with ``huggingface_hub``
    when it is not -- the lane image's own copy, so the host needs nothing but docker. The token
    (from the controller's ``token_env``) reaches the host only as a 0600 file, mounted read-only
    into the download and removed after it; it is never on a command line or in the output.

    + repo, revision: the repository and its pinned revision
    + cache_dir: the HF hub cache folder (``model_dir``)
    + image: an image with python3 and huggingface_hub (the lane image, staged before)
    + token_env: the controller environment variable holding the token (may be unset)
    + endpoint: the hub's URL (``HF_ENDPOINT``, a mirror); empty: huggingface.co
    """
    repo_path = stage.repo_dir(cache_dir, repo)
    if gathered(host, Directory, path=f"{repo_path}/snapshots/{revision}") or (
        not re.fullmatch(r"[0-9a-f]{40}", revision) and gathered(host, File, path=f"{repo_path}/refs/{revision}")
    ):
        host.noop(f"{repo}@{revision} is in {cache_dir}")
        return
    token = os.environ.get(token_env, "")
    token_file = f"/run/sparkinfra/hf_token.{abs(hash((repo, revision))) % 10**8}"
    if token:
        # Not files.put: its --diff output would print the token. A function command holds the
        # token in a closure (its repr names only the function) and uploads it into a 0600 file.
        def upload_token(state, host):
            # The folder is root-only (0700) before the token is in it.
            host.run_shell_command(StringCommand("install", "-d", "-m", "700", "/run/sparkinfra"), _sudo=True)
            return _put_secret(host, token, token_file)

        yield FunctionCommand(upload_token, (), {})
    script = (
        "import os, sys\n"
        "f = '/run/hf_token'\n"
        "token = open(f).read().strip() if os.path.exists(f) else None\n"
        "from huggingface_hub import snapshot_download\n"
        "print(snapshot_download(sys.argv[1], revision=sys.argv[2], cache_dir=sys.argv[3], token=token))\n"
    )
    run = [
        "docker", "run", "--rm", "--network", "host", "--entrypoint", "python3",
        "-v", f"{shlex.quote(cache_dir)}:{shlex.quote(cache_dir)}",
        *(["-v", f"{token_file}:/run/hf_token:ro"] if token else []),
        *(["-e", f"HF_ENDPOINT={shlex.quote(endpoint)}"] if endpoint else []),
        shlex.quote(image), "-c", shlex.quote(script), shlex.quote(repo), shlex.quote(revision), shlex.quote(cache_dir),
    ]
    yield f"mkdir -p {shlex.quote(cache_dir)} && {' '.join(run)}; rc=$?; rm -f {token_file}; exit $rc"


# Secrets
# -------


def _put_secret(host, content: str, path: str) -> bool:
    """
    Upload a secret into a root-only 0600 file. pyinfra's sudo upload passes through a temp file
    the SSH user writes (``/tmp`` by default, readable by others): here that file is in a folder
    only the SSH user can enter (``mktemp -d``), and the destination is 0600 root before the copy.
    """
    q = QuoteString(path)
    host.run_shell_command(StringCommand("install", "-m", "600", "-o", "root", "-g", "root", "/dev/null", q), _sudo=True)
    ok, output = host.run_shell_command(StringCommand("mktemp", "-d"), _sudo=False)
    private = output.stdout.strip() if ok else ""
    if not private.startswith("/"):
        return False
    try:
        return host.put_file(io.StringIO(content), path, remote_temp_filename=f"{private}/upload", _sudo=True)
    finally:
        host.run_shell_command(StringCommand("rm", "-rf", QuoteString(private)), _sudo=False)


@operation()
def secret_env_file(path: str, variable: str, env: str, present: bool = True):
    """
    Ensure a root-only (0600) env file holds ``VARIABLE=<value of the controller's $env>``. The
    value is compared by its sha256 and uploaded by a function command: it never appears in
    pyinfra's output, ``--diff``, ``--debug`` or ``--json``, nor on a command line.

    + path: the file on the host
    + variable: the variable it defines (``VLLM_API_KEY``)
    + env: the controller environment variable holding the value
    + present: whether the file must exist
    """

    if not present:
        if gathered(host, File, path=path):
            yield StringCommand("rm", "-f", QuoteString(path))
        else:
            host.noop(f"{path} is absent")
        return
    value = os.environ.get(env, "")
    if not value:
        yield from _refuse(f"{host.name}: the controller's ${env} is empty; it must hold the secret for {path}")
        return
    content = f"{variable}={value}\n"
    info = gathered(host, File, path=path)
    same = info and gathered(host, Sha256File, path=path) == hashlib.sha256(content.encode()).hexdigest()
    if same and info.get("mode") == 600 and info.get("user") == "root":
        host.noop(f"{path} holds the current secret")
        return

    def upload(state, host):
        # The folder is root-only before the secret is in it; the file is 0600 before it is filled.
        folder = str(Path(path).parent)
        host.run_shell_command(StringCommand("install", "-d", "-m", "755", folder), _sudo=True)
        return _put_secret(host, content, path)

    yield FunctionCommand(upload, (), {})


# Lanes
# -----

ACTIVE_STATES = ("active", "activating", "reloading", "deactivating")


@operation()
def other_lanes_stopped(lane: str):
    """
    Ensure no other lane's unit runs, or starts at boot, on this node (one lane at a time).

    + lane: the lane that may run (empty: none may)
    """
    units = gathered(host, LaneUnits)
    others = sorted(
        name for name, state in units.items()
        if name != lane and (state["active"] in ACTIVE_STATES or state["enabled"] == "enabled")
    )
    failed = sorted(name for name, state in units.items() if name != lane and state["active"] == "failed")
    if not others and not failed:
        host.noop("no other lane runs here")
        return
    if others:
        yield StringCommand("systemctl", "disable", "--now", *[serving.unit_name(o) for o in others])
    # A rank stopped mid-start may end "failed": stopped on purpose, it is just inactive.
    stale = sorted(set(others) | set(failed))
    yield StringCommand("systemctl", "reset-failed", *[serving.unit_name(o) for o in stale], "2>/dev/null", "||", "true")


@operation()
def lane_units_absent():
    """
    Ensure no lane's unit file is left in ``/etc/systemd/system`` (a full teardown); a unit still
    running or enabled is stopped and disabled first. Reload systemd after it (``_if=`` its
    ``did_change``).
    """
    units = gathered(host, LaneUnits)
    if not units:
        host.noop("no lane unit is installed")
        return
    live = sorted(
        name for name, state in units.items()
        if state["active"] in ACTIVE_STATES or state["enabled"] == "enabled"
    )
    if live:
        yield StringCommand("systemctl", "disable", "--now", *[serving.unit_name(n) for n in live])
    yield StringCommand("rm", "-f", *[QuoteString(f"/etc/systemd/system/{serving.unit_name(n)}") for n in sorted(units)])


@operation()
def lane_validated(lane: str, image: str, request: dict, docker_options: list[str]):
    """
    Ensure the lane's serve arguments of every rank passed the vLLM inside the lane's image (its own
    parser, ``validate_parsed_serve_args``, and ``create_engine_config`` against the staged model),
    for this image ID and these arguments. Nothing starts while they do not.

    + lane: the lane's name
    + image: the lane's image (on this node, the head)
    + request: what ``scripts/vllm_check.py`` checks (``lanes.vllm_request(..., in_image=True)``)
    + docker_options: ``docker run`` options giving the check the lane's mounts and environment
    """

    image_id = gathered(host, DockerImageId, image=image) or "absent"
    check = scripts.text("vllm_check.py")
    request = json.dumps(request, sort_keys=True)
    key = hashlib.sha256(f"{image_id}\n{request}\n{check}".encode()).hexdigest()[:16]
    marker = serving.validated_path(lane)
    if gathered(host, FileDigest, path=marker) == key:
        host.noop(f"{lane}'s arguments passed the image's vLLM")
        return
    script, data = f"{serving.STATE_DIR}/vllm_check.py", f"{serving.STATE_DIR}/{lane}.check.json"
    yield StringCommand("mkdir", "-p", "-m", "700", serving.STATE_DIR)
    yield from files.put._inner(src=io.StringIO(check), dest=script, mode="644")
    yield from files.put._inner(src=io.StringIO(request), dest=data, mode="600")
    run = " ".join(
        ["docker", "run", "--rm", "-i", "--entrypoint", "python3", "-v", f"{script}:/tmp/vllm_check.py:ro",
         *[shlex.quote(o) for o in docker_options], shlex.quote(image), "/tmp/vllm_check.py"]
    )
    report = (
        "import json,sys; r=json.loads(sys.stdin.read() or '{}'); "
        "ok=r.get('ok'); print(('vLLM ' + str(r.get('vllm')) + ' accepts every rank') if ok else "
        "('vLLM ' + str(r.get('vllm')) + ' refuses rank ' + str(r.get('rank')) + ': ' + str(r.get('error'))), "
        "file=sys.stdout if ok else sys.stderr); sys.exit(0 if ok else 1)"
    )
    yield f"{run} < {data} | python3 -c {shlex.quote(report)} && echo {key} > {marker}"


@operation()
def lane_running(lane: str, digest: str, ready_timeout: int):
    """
    Ensure the lane serves: its units active on every node, started from the current plan (digest),
    and the head's API completing a request. Otherwise the whole lane restarts (workers first,
    from the head's unit) and this waits until a completion returns tokens.

    + lane: the lane's name (this runs on its head)
    + digest: the plan every rank must run (``serving.lane_digest``)
    + ready_timeout: seconds the lane may take to answer after a (re)start
    """
    status = host.get_fact(LaneStatus, lane=lane) or {}
    unit = serving.unit_name(lane)
    wait = StringCommand("python3", serving.LANE_CTL, "wait-ready", QuoteString(lane), str(ready_timeout))
    age = status.get("age")
    starting = (
        status.get("unit") in ("active", "activating") and status.get("started") == digest
        and age is not None and age < ready_timeout and status.get("api") != "ok"
        and all(state in ("active", "activating") for state in status.get("workers", {}).values())
    )
    if starting:
        # Already (re)starting on its own (its unit restarts the lane when a rank dies): wait for it,
        # restarting it only if it does not become ready.
        logger.info(f"    [{host.name}] {unit} is starting ({age}s ago): waiting for it")
        yield StringCommand(wait, "||", "(", "systemctl", "restart", unit, "&&", wait, ")")
        return
    reasons = []
    if status.get("unit") != "active":
        reasons.append(f"its unit is {status.get('unit', 'not installed')}")
    elif status.get("started") != digest:
        reasons.append("its plan changed")
    else:
        down = [f"{ip} ({state})" for ip, state in sorted(status.get("workers", {}).items()) if state != "active"]
        if down:
            reasons.append("workers not running: " + ", ".join(down))
        elif status.get("api") != "ok":
            reasons.append(f"the API does not complete ({status.get('api')})")
    if not reasons:
        host.noop(f"lane {lane} serves")
        return
    # Said in every run, --dry included: what restarts, and why.
    logger.info(f"    [{host.name}] {unit} restarts (with its workers): {'; '.join(reasons)}")
    yield StringCommand("systemctl", "restart", unit)
    yield wait


@operation()
def lane_warm(lane: str, digest: str):
    """
    Ensure the running lane has had one throwaway request per workload shape since it started,
    so start-up JIT costs never land in a measurement.

    + lane: the lane's name (this runs on its head)
    + digest: the plan the lane runs
    """
    status = host.get_fact(LaneStatus, lane=lane, probe=False) or {}  # the marks are enough here
    if status.get("warm") == digest and status.get("started") == digest:
        host.noop(f"lane {lane} is warm")
        return
    yield StringCommand("python3", serving.LANE_CTL, "warmup", QuoteString(lane))
