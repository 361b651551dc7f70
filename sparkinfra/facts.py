"""
Facts: what a node's state is now, read from the node itself.
"""

from __future__ import annotations

import json
import re
import secrets
import weakref

import gevent
from gevent.event import AsyncResult
from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from .serving import LANE_CTL
from .stage import tool_source

_gathered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> {key: AsyncResult}
_ahead: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # state -> {host name: {read: (cls, kwargs)}}
_ALONE = object()  # a read the batch could not answer: read it in a command of its own


def gathered(host, cls, **kwargs):
    """
    Returns ``host.get_fact(cls, **kwargs)``, gathered once for as long as no operation of this
    run has run a command on any host (a command on one node can change another: the head
    streams to the workers), and separately while pyinfra only detects changes. Hosts asking for
    the same fact at the same time (every worker reading the head's manifest) share one command:
    each would otherwise open its own SSH session on that host's one connection, and sshd
    refuses sessions past ``MaxSessions`` (10). Read facts before yielding a command.

    .. code:: python

        wanted = gathered(head, SnapshotManifest, repo_dir=repo_dir, deep=False)
    """
    state = host.state
    cache = _gathered.setdefault(state, {})
    generation = _generation(state)
    read = _read(cls, kwargs)
    key = (host.name, *read, state.current_stage, generation)
    if key not in cache and generation == 0:
        ahead = _ahead.get(state, {}).get(host.name, {})
        if read in ahead and (host.name, _ALONE, state.current_stage) not in cache:
            _read_together(host, ahead, cache, state.current_stage)
    if key not in cache:
        cache[key] = result = AsyncResult()
        try:
            result.set(host.get_fact(cls, **kwargs))
        except BaseException as e:
            del cache[key]
            result.set_exception(e)
            raise
    value = cache[key].get()
    return gathered(host, cls, **kwargs) if value is _ALONE else value


def read_ahead(host, reads) -> None:
    """
    Declares the facts ``host``'s operations will read through ``gathered`` in this run: the first
    of them read before any operation has run a command reads them all in one command (one SSH
    session, one sudo on the node) rather than one command each. A fact missing from the list,
    read later in the run, or that fails in the batch (its command missing, an error) is read
    in a command of its own, exactly as without this. Only cheap reads belong here.

    .. code:: python

        read_ahead(host, [(FabricLink, {"interface": "enp1s0f0np0"}), (NetworkConfigBackend, {})])
    """
    ahead = _ahead.setdefault(host.state, {}).setdefault(host.name, {})
    for cls, kwargs in reads:
        ahead[_read(cls, kwargs)] = (cls, kwargs)


def _read(cls, kwargs: dict) -> tuple:
    """A fact and its arguments as one key: ``gathered``'s cache and ``read_ahead``'s list agree on it."""
    return cls, repr(sorted(kwargs.items()))


def _read_together(host, ahead: dict, cache: dict, stage) -> None:
    """Reads every fact of ``ahead`` not read yet for ``stage`` with one ``Together`` command."""
    cache[(host.name, _ALONE, stage)] = True  # the first miss in this stage starts no other
    pending = {}
    for read, (cls, kwargs) in ahead.items():
        key = (host.name, *read, stage, 0)
        if key not in cache and _batchable(cls):
            cache[key] = AsyncResult()
            pending[key] = (cls, kwargs)
    if not pending:
        return
    reads = tuple((cls(), kwargs) for cls, kwargs in pending.values())  # one instance runs and reads
    parts = None
    try:
        parts = host.get_fact(Together, reads=reads)
    except Exception:  # each read on its own says what is wrong
        pass
    finally:  # whatever happened, no one waits for ever
        for i, (key, (fact, _)) in enumerate(zip(pending, reads)):
            value = _ALONE
            if parts and i < len(parts) and parts[i][0] == 0:
                try:
                    value = fact.process(parts[i][1]) if parts[i][1] else fact.default()
                except Exception:
                    value = _ALONE
            result = cache[key]
            if value is _ALONE:  # whoever waits on it reads it alone, in a fresh entry
                del cache[key]
            result.set(value)


def _batchable(cls) -> bool:
    """A fact ``Together`` can run as pyinfra would: in ``sh``, with no check of its own first."""
    return not cls.shell_executable and cls.check_preconditions is FactBase.check_preconditions


def gathered_each(hosts, cls, **kwargs) -> list:
    """
    Returns ``gathered(h, cls, **kwargs)`` for each of ``hosts``, in order, read from all of them
    at once rather than one round trip after the other.

    .. code:: python

        ids = gathered_each([spark2, spark3], DockerImageId, image="vllm-node:latest")
    """
    return at_once([(h, gathered, h, cls, kwargs) for h in hosts])


def at_once(calls: list) -> list:
    """
    Runs each ``(host, function, *args, kwargs)`` call in its own greenlet, with pyinfra's
    context set to that host as when it loads a deploy; returns the results in order.
    """
    jobs = [gevent.spawn(_as_host, h, function, *args, **kwargs) for h, function, *args, kwargs in calls]
    gevent.joinall(jobs, raise_error=True)
    return [job.value for job in jobs]


def unproxied(obj):
    """The object behind pyinfra's context proxy (``from pyinfra import host, state``): the proxy
    means nothing in a greenlet of one's own."""
    return obj._get_module() if hasattr(obj, "_get_module") else obj


def _as_host(h, function, *args, **kwargs):
    """``function(*args, **kwargs)`` with pyinfra's context set to host ``h``."""
    from pyinfra.context import ctx_config, ctx_host, ctx_state

    with ctx_state.use(h.state), ctx_config.use(h.state.config), ctx_host.use(h):
        return function(*args, **kwargs)


def _generation(state) -> int:
    """How many operations have run commands so far in this run, over all hosts."""
    return sum(
        1
        for ops in state.ops.values()
        for data in ops.values()
        if data.operation_meta.is_complete() and data.operation_meta.executed
    )


class FabricLink(FactBase):
    """
    Returns the live state of a network interface, or ``None`` when it does not exist.

    + interface: the interface name (``enp1s0f0np0`` on a Spark)

    .. code:: python

        {
            "mtu": 4200,
            "admin_up": True,     # ip link set up was done
            "carrier": True,      # the peer / switch port is there too
            "ipv4": ["192.168.192.1/24"],
            "mac": "4c:bb:47:00:00:01",
        }
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "ip"

    @override
    def command(self, interface: str) -> StringCommand:
        return StringCommand(
            "ip", "-j", "addr", "show", "dev", QuoteString(interface), "2>/dev/null", "||", "true"
        )

    @override
    def process(self, output):
        return parse_ip_addr_json("\n".join(output))


def parse_ip_addr_json(text: str) -> dict | None:
    """Parse ``ip -j addr show dev X`` into ``FabricLink``'s shape (``None``: no such interface)."""
    entries = json.loads(text) if text.strip() else []
    if not entries:
        return None
    entry = entries[0]
    flags = entry.get("flags", [])
    return {
        "mtu": int(entry["mtu"]),
        "admin_up": "UP" in flags,
        "carrier": "LOWER_UP" in flags and "NO-CARRIER" not in flags,
        "ipv4": [
            f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", []) if a.get("family") == "inet"
        ],
        "mac": entry.get("address", ""),
    }


# RoCE GID table
# --------------

GID_ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


class RoceGidTable(FactBase):
    """
    Returns the populated rows of an RDMA port's GID table, from sysfs (``show_gids`` when the
    sysfs table is not there), or ``None`` when the device has neither.

    + device: the RDMA device (``rocep1s0f0``)
    + port: its port (1)

    .. code:: python

        [
            {"index": 0, "gid": "fe80:0000:...", "type": "IB/RoCE v1", "ndev": "enp1s0f0np0"},
            {"index": 3, "gid": "0000:...:ffff:c0a8:c001", "type": "RoCE v2", "ndev": "enp1s0f0np0"},
        ]
    """

    @override
    def command(self, device: str, port: int = 1) -> str:
        base = f"/sys/class/infiniband/{device}/ports/{int(port)}"
        # One "sysfs<TAB>index<TAB>gid<TAB>type<TAB>ndev" line per row (an unpopulated row's
        # type reads as an error: empty), read with the shell's builtins (no process per row);
        # else the show_gids table as it prints.
        return (
            f"if [ -d {base}/gids ]; then for g in {base}/gids/*; do i=${{g##*/}}; gid=; t=; n=; "
            f"read -r gid < $g; read -r t < {base}/gid_attrs/types/$i; read -r n < {base}/gid_attrs/ndevs/$i; "
            f"printf 'sysfs\\t%s\\t%s\\t%s\\t%s\\n' \"$i\" \"$gid\" \"$t\" \"$n\"; done 2>/dev/null; "
            f"elif command -v show_gids >/dev/null; then show_gids {device} {int(port)}; fi"
        )

    @override
    def process(self, output):
        return parse_gid_table(output)


def parse_gid_table(lines) -> list[dict] | None:
    """Parse the fact's sysfs dump or ``show_gids`` output into populated rows, by index."""
    rows = []
    seen_any = False
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "sysfs":
            seen_any = True
            _, index, gid, kind, ndev = (fields + [""] * 5)[:5]
            if gid.strip() and gid.strip() != GID_ZERO and kind.strip():
                rows.append({"index": int(index), "gid": gid.strip(), "type": kind.strip(), "ndev": ndev.strip()})
            continue
        # show_gids: DEV PORT INDEX GID IPv4 VER DEV (whitespace separated, IPv4 may be empty)
        words = line.split()
        if not words or words[0] in ("DEV", "---") or words[0].startswith("n_gids_found"):
            seen_any = seen_any or bool(words)
            continue
        if len(words) >= 6 and words[2].isdigit():
            seen_any = True
            version = words[-2]
            rows.append(
                {
                    "index": int(words[2]),
                    "gid": words[3],
                    "type": "RoCE v2" if version == "v2" else "IB/RoCE v1",
                    "ndev": words[-1],
                }
            )
    if not seen_any:
        return None
    return sorted(rows, key=lambda r: r["index"])


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address an IPv4-mapped GID (``::ffff:a.b.c.d``) carries, else ``None``."""
    from ipaddress import IPv6Address

    try:
        mapped = IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def roce_v2_index(rows: list[dict], ipv4: str, netdev: str | None = None) -> int | None:
    """
    The GID index NCCL must use: the RoCE v2 row carrying the node's IPv4 (never the
    link-local rows 0/1, never a guess). ``None`` when there is no such row.
    """
    for row in rows:
        if row["type"] != "RoCE v2" or gid_ipv4(row["gid"]) != ipv4:
            continue
        if netdev and row["ndev"] and row["ndev"] != netdev:
            continue
        return row["index"]
    return None


class NetworkConfigBackend(FactBase):
    """
    Returns how this host persists network config: ``netplan`` (DGX OS) when netplan is
    installed, else ``systemd`` (a unit of our own sets the port at boot).
    """

    @override
    def command(self) -> str:
        return "if command -v netplan >/dev/null 2>&1; then echo netplan; else echo systemd; fi"

    @override
    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


class NcclVersion(FactBase):
    """
    Returns the version a libnccl reports through ``ncclGetVersion`` (``"2.30.7"``), or
    ``None`` when the file is missing or cannot be loaded.

    + path: the library file
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    @override
    def command(self, path: str) -> StringCommand:
        probe = (
            "import ctypes,sys\n"
            "try:\n"
            " lib=ctypes.CDLL(sys.argv[1]); v=ctypes.c_int()\n"
            " assert lib.ncclGetVersion(ctypes.byref(v))==0; print(v.value)\n"
            "except Exception as e: print('error', e)\n"
        )
        return StringCommand("python3", "-I", "-S", "-c", QuoteString(probe), QuoteString(path))

    @override
    def process(self, output):
        return nccl_version_from_code(output[0]) if output else None


def nccl_version_from_code(text: str) -> str | None:
    """``ncclGetVersion``'s integer as a dotted version (2.9+: 23007 -> 2.30.7; older: 2708 -> 2.7.8)."""
    text = text.strip()
    if not text.isdigit():
        return None
    code = int(text)
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


class DockerContainer(FactBase):
    """
    Returns a container's state by name (``{"status": "exited", "running": False}``), or
    ``None`` when there is no such container (or no docker).

    + container: the container name
    """

    @override
    def command(self, container: str) -> StringCommand:
        return StringCommand(
            # container inspect: a plain ``inspect`` of a missing name goes on to look for an image,
            # network, volume... of that name, one API call each
            "docker", "container", "inspect", "--format", QuoteString("{{.State.Status}} {{.State.Running}}"),
            QuoteString(container), "2>/dev/null", "||", "true",
        )

    @override
    def process(self, output):
        words = " ".join(output).split()
        if len(words) != 2:
            return None
        return {"status": words[0], "running": words[1] == "true"}


class DockerImageId(FactBase):
    """
    Returns the ID of a local image (``sha256:...``), or ``None`` when it is not there.

    + image: the image name:tag
    """

    @override
    def command(self, image: str) -> StringCommand:
        return StringCommand(
            "docker", "image", "inspect", "--format", QuoteString("{{.Id}}"), QuoteString(image),
            "2>/dev/null", "||", "true",
        )

    @override
    def process(self, output):
        value = " ".join(output).strip()
        return value if value.startswith("sha256:") else None


def _snapshot_tool_command(*args: str) -> StringCommand:

    return StringCommand("python3", "-I", "-S", "-c", QuoteString(tool_source()), *(QuoteString(a) for a in args))


class SnapshotManifest(FactBase):
    """
    Returns the manifest state of a snapshot copy on this host:
    ``{"exists": True, "stale": False, "files": 12, "bytes": 2147483648, "digest": "..."}``.
    Equal digests on two hosts mean equal snapshots (paths, sizes, sha256, symlinks).

    + repo_dir: the repository's folder in the HF cache (``.../models--org--name``)
    + deep: hash every file now instead of trusting the size/mtime cache
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    @override
    def command(self, repo_dir: str, deep: bool = False) -> StringCommand:
        return _snapshot_tool_command("manifest", repo_dir, *(["--deep"] if deep else []))

    @override
    def process(self, output):
        return json.loads("\n".join(output))


class LaneUnits(FactBase):
    """
    Returns the lane units installed on a node: ``{lane: {"active": str, "enabled": str}}``.
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self) -> str:
        return (
            "for f in /etc/systemd/system/sparkinfra-lane-*.service; do [ -e \"$f\" ] || continue; "
            "u=$(basename \"$f\"); echo \"$u $(systemctl is-active \"$u\") $(systemctl is-enabled \"$u\" 2>/dev/null)\"; "
            "done"
        )

    @override
    def process(self, output):
        units = {}
        for line in output:
            words = line.split()
            if len(words) >= 2 and words[0].startswith("sparkinfra-lane-"):
                lane = words[0][len("sparkinfra-lane-"):-len(".service")]
                units[lane] = {"active": words[1], "enabled": words[2] if len(words) > 2 else "unknown"}
        return units


class LaneStatus(FactBase):
    """
    Returns a lane's state on this node, as ``lane_ctl.py status`` reports it, or ``{}`` before the
    lane is placed. On the head: the workers' units and whether the API completes a request.

    .. code:: python

        {
            "unit": "active", "planned": "9f2c...", "started": "9f2c...", "warm": "9f2c...",
            "container": "true sha256:...", "workers": {"10.0.0.2": "active"},
            "api": "ok",                  # or "down", or the failing HTTP answer
            "others": [],                 # other lanes' units active here
        }

    + lane: the lane's name
    + probe: on the head, also ask the workers' units and the API (else ``workers`` stays empty and
      ``api`` None: the marks and this node's unit only)
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self, lane: str, probe: bool = True) -> StringCommand:

        local = [] if probe else ["--local"]
        return StringCommand(
            "test", "-f", LANE_CTL, "&&", "python3", LANE_CTL, "status", QuoteString(lane), *local, "||", "echo", "'{}'"
        )

    @override
    def process(self, output):
        return json.loads("\n".join(output) or "{}")


class FileDigest(FactBase):
    """
    Returns the first line of a small marker file, or ``None`` when it is missing.

    + path: the file
    """

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand("head", "-n1", QuoteString(path), "2>/dev/null", "||", "true")

    @override
    def process(self, output):
        return output[0].strip() if output and output[0].strip() else None


class SnapshotFiles(FactBase):
    """
    Returns the files at the top of a model snapshot folder (symlinks followed) with their sizes,
    ``{"tokenizer.json": 2117, ...}``, or ``{}`` when the folder is missing.

    + path: the snapshot folder (``<cache>/models--org--name/snapshots/<revision>``)
    """

    @staticmethod
    def default():
        return {}

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "find", "-L", QuoteString(path), "-maxdepth", "1", "-type", "f", "-printf", QuoteString("%s %f\\n"),
            "2>/dev/null", "||", "true",
        )

    @override
    def process(self, output):
        files = {}
        for line in output:
            size, _, name = line.strip().partition(" ")
            if size.isdigit() and name:
                files[name] = int(size)
        return files


class FileState(FactBase):
    """
    Returns what a file operation needs to know about ``path`` in one command (pyinfra's
    ``files.put`` asks three: ``File``, ``Directory`` of its folder and ``Sha1File``):

    .. code:: python

        {"kind": "file", "mode": "644", "user": "root", "group": "root",
         "sha1": "…", "parent": True}

    ``kind`` is ``file``, ``absent`` or ``other`` (a link, folder or device in the way); ``mode``,
    ``user``, ``group`` and ``sha1`` are ``None`` unless it is a file. ``parent``: its folder exists.

    + path: the file
    """

    @override
    def command(self, path: str) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(
            'p=$1; if [ -L "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then echo other; '
            'elif [ -f "$p" ]; then stat -c "file %a %U %G" -- "$p" && sha1sum -- "$p"; '
            'else echo absent; fi; '
            'if [ -d "$(dirname -- "$p")" ]; then echo parent; else echo no-parent; fi'
        ), "-", QuoteString(path))

    @override
    def process(self, output):
        return parse_file_state(output)


def parse_file_state(lines) -> dict:
    """``FileState``'s output as a dict (see there)."""
    lines = [line.strip() for line in lines if line.strip()]
    state = {"kind": "absent", "mode": None, "user": None, "group": None, "sha1": None,
             "parent": bool(lines) and lines[-1] == "parent"}
    head = lines[0].split() if lines else []
    if head[:1] == ["other"]:
        state["kind"] = "other"
    elif head[:1] == ["file"] and len(head) == 4 and len(lines) >= 3:
        state.update(kind="file", mode=head[1], user=head[2], group=head[3], sha1=lines[1].split()[0])
    return state


class Together(FactBase):
    """
    Returns the outputs of several facts' commands run in one command, each with its exit
    status, in order: ``[(0, ["line", …]), (127, [])]``; ``None`` if the output is cut short.
    A fact whose ``requires_command`` is missing exits 127. Used by ``read_ahead``.

    + reads: ``(fact, kwargs)`` pairs; read each output with the same fact instance (pyinfra's
      ``FileContents`` keeps what its command printed for a missing file)
    """

    @override
    def command(self, reads: tuple) -> StringCommand:
        nonce = secrets.token_hex(8)  # no fact's output holds it: it marks where each ends
        parts = []
        for i, (fact, kwargs) in enumerate(reads):
            command = _fact_command(fact.command, kwargs)
            requires = _fact_command(fact.requires_command, kwargs)
            end = f"echo {nonce} {i} $?"
            if requires:
                parts.append(StringCommand(f"if command -v {requires} >/dev/null 2>&1; then (", command,
                                           f"); else (exit 127); fi; {end}", _separator="\n"))
            else:
                parts.append(StringCommand("(", command, f"); {end}", _separator="\n"))
        return StringCommand(*parts, _separator="\n")

    @override
    def process(self, output):
        return split_together(output)


def split_together(lines) -> list | None:
    """``Together``'s output as ``[(status, lines), …]`` (see there)."""
    last = re.fullmatch(r".*?([0-9a-f]{16}) \d+ \d+", lines[-1]) if lines else None
    if not last:
        return None
    nonce, parts, current = last.group(1), [], []
    for line in lines:
        before, found, after = line.rpartition(nonce)
        end = re.fullmatch(r" (\d+) (\d+)", after) if found else None
        if end and int(end.group(1)) == len(parts):
            if before:  # the fact's last line had no newline
                current.append(before)
            parts.append((int(end.group(2)), current))
            current = []
        else:
            current.append(line)
    return parts


def _fact_command(attribute, kwargs: dict):
    """A fact's ``command`` or ``requires_command``, called with ``kwargs`` when it is a method."""
    return attribute(**kwargs) if callable(attribute) else attribute


class AuthorizedKeys(FactBase):
    """
    Returns what ``ssh_key_authorized`` checks, in one command (pyinfra's ``Home``,
    ``Directory``, ``FindInFile`` and ``File`` would be four): ``user``'s home, the kind, owner,
    group and mode of ``~/.ssh`` and ``~/.ssh/authorized_keys``, and that file's lines.

    .. code:: python

        {"home": "/home/ubuntu", "ssh_dir": ["directory", "ubuntu", "ubuntu", "700"],
         "file": ["file", "ubuntu", "ubuntu", "600"], "lines": ["from=\"10.0.0.1\" ssh-ed25519 …"]}

    A kind is ``directory``, ``file``, ``absent`` or ``other``. ``None`` if ``user`` has no home.

    + user: the user whose keys these are
    """

    @override
    def command(self, user: str) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(
            'h=$(getent passwd "$1" | cut -d: -f6); [ -n "$h" ] || exit 0; echo "$h"; '
            'for p in "$h/.ssh" "$h/.ssh/authorized_keys"; do '
            'if [ -L "$p" ]; then echo other; '
            'elif [ -d "$p" ]; then stat -c "directory %U %G %a" -- "$p"; '
            'elif [ -f "$p" ]; then stat -c "file %U %G %a" -- "$p"; '
            'elif [ -e "$p" ]; then echo other; else echo absent; fi; done; '
            'cat -- "$h/.ssh/authorized_keys" 2>/dev/null || true'
        ), "-", QuoteString(user))

    @override
    def process(self, output):
        return parse_authorized_keys(output)


def parse_authorized_keys(lines) -> dict | None:
    """``AuthorizedKeys``' output as a dict (see there)."""
    if len(lines) < 3:
        return None
    ssh_dir, file = (line.split() if len(line.split()) == 4 else [line.strip(), None, None, None]
                     for line in lines[1:3])
    return {"home": lines[0], "ssh_dir": ssh_dir, "file": file, "lines": [line for line in lines[3:] if line.strip()]}
