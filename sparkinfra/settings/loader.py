"""
The settings loaded from a pyinfra inventory: every host's data as pyinfra layers it (``--data`` >
inventory host data > group data > ``all``) validated by ``HostSettings``, grouped into clusters. An
error names the file (or ``--data``), the key and the host, and says what is wrong in words:
pydantic's are reworded (``in_words``), a bound says why (``WHY``), a typo gets the nearest key.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# Keys pyinfra's SSH connector reads from host data (``ssh_user``, ``ssh_key`` ...).
from pyinfra.connectors.ssh import connector_data_meta as _SSH_KEYS

from .model import CLUSTER_KEYS, NODE_KEYS, WHY, Cluster, Fabric, HostSettings, Node, Settings
from .rules import host_name_problem


class SettingsError(Exception):
    """Bad settings: one message naming the file and the key."""



def _assigned_names(path: Path) -> set[str]:
    """Names a group_data file assigns anywhere at module level (read, not executed)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return set()
    return {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }


class _Sources:
    """Says where a host's key came from, following pyinfra's layering."""

    # How specific each layer is: the more specific side of a disagreement is the odd one out.
    HOST, GROUP, ALL, DEFAULT = 3, 2, 1, 0

    def __init__(self, inventory, inventory_file: str | None, group_data_dirs: list[Path], cwd: Path):
        self.inventory = inventory
        self.inventory_file = inventory_file or "the inventory"
        self.dirs = group_data_dirs
        self.cwd = cwd

    def _group_file(self, group: str, key: str) -> str | None:
        for folder in reversed(self.dirs):
            path = folder / f"{group}.py"
            if path.is_file() and key in _assigned_names(path):
                return display(path, self.cwd)
        return None

    def layer(self, host, key: str) -> tuple[int, str]:
        """(specificity, file) of the layer the host's value of ``key`` comes from."""
        inv = self.inventory
        if key in (inv.get_override_data() or {}):
            return self.HOST + 1, "--data"
        if key in inv.get_host_data(host.name):
            return self.HOST, self.inventory_file
        for group in reversed(host.groups):
            if key in inv.get_group_data(group):
                return self.GROUP, self._group_file(group, key) or self.inventory_file
        if key in inv.get_data():
            return self.ALL, self._group_file("all", key) or self.inventory_file
        # Not set anywhere: the inventory that declares the host is where it belongs.
        return self.DEFAULT, self.inventory_file

    def of(self, host, key: str) -> str:
        return self.layer(host, key)[1]


def display(path: Path, cwd: Path | None = None) -> str:
    try:
        return str(path.resolve().relative_to((cwd or Path.cwd()).resolve()))
    except ValueError:
        return str(path)


def _host_data(inventory, host) -> dict[str, Any]:
    """The host's merged data, as pyinfra layers it (lowest layer first)."""
    merged: dict[str, Any] = {}
    merged.update(inventory.get_data())
    merged.update(inventory.get_groups_data(host.groups))
    merged.update(inventory.get_host_data(host.name))
    merged.update(inventory.get_override_data() or {})
    return merged


def _error(source: str, key: str, host: str, message: str) -> SettingsError:
    where = f"{source}, key '{key}'" if key else source
    who = f" (host {host})" if host else ""
    return SettingsError(f"{where}{who}: {message}")


# pydantic's errors, in the tool's words ({name}: from the error's context).
SAID = {
    "missing": "required key is missing",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be text (a quoted string)",
    "list_type": "must be a list",
    "dict_type": "must be a mapping (a dict)",
    "literal_error": "must be {expected}",
    "greater_than_equal": "must be {ge} or more",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be {le} or less",
    "less_than": "must be less than {lt}",
    "too_short": "must hold at least {min_length} item(s)",
    "too_long": "must hold at most {max_length} item(s)",
    "ip_v4_address": "must be an IPv4 address (four numbers 0-255)",
    "ip_v4_network": "must be an IPv4 network: address/prefix, the prefix 0..32, no host bits set (10.0.0.0/24)",
}
# What a key with a pattern must look like (others say it with their rule, or their description).
FORM = {
    "nccl_version": "x.y.z, as NCCL reports it (2.30.7)",
    "image_id": "sha256: and 64 hex digits, as docker reports an image ID, or empty",
    "gpu_clock_cap": "MIN,MAX in MHz, as nvidia-smi -lgc takes it (200,2150), or empty",
    "hf_token_env": "an environment variable's name (letters, digits and '_', not starting with a digit)",
    "api_key_env": "an environment variable's name (letters, digits and '_', not starting with a digit), or empty",
    "hf_endpoint": "an http(s) URL without user:password@ (a token goes in hf_token_env), or empty",
}
ENV_NAME_FORM = "an environment variable's name (letters, digits and '_', not starting with a digit)"


def _within(loc: tuple) -> str:
    """Where inside a key's value an error is: ``item 2: ``, ``'NCCL_X': ``, ``name 'X-Y': ``."""
    rest = loc[1:]
    if not rest:
        return ""
    if rest[-1] == "[key]":
        return f"name {rest[0]!r}: "
    if isinstance(rest[0], int):
        return f"item {rest[0] + 1}: "
    return f"{rest[0]!r}: "


def nearest(key: str, known) -> str | None:
    """The one of ``known`` keys ``key`` is a typo of (None: none near enough)."""
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return near[0] if near else None


def unknown_key(key: str) -> str:
    """The refusal of an unknown key, with the nearest known one (a typo)."""
    near = nearest(key, [*HostSettings.model_fields, *_SSH_KEYS])
    if near:
        return f"unknown key — did you mean '{near}'?"
    return "unknown key: neither a setting (docs/settings.md) nor one of pyinfra's ssh_* keys"


# Settings whose refused value is not repeated in the message: it may hold a credential.
UNECHOED = frozenset({"hf_endpoint"})


def in_words(err: dict) -> tuple[str, str, str]:
    """(key, host, what is wrong) of one pydantic error of the settings' models, said for a person."""
    ctx = err.get("ctx") or {}
    key = ctx.get("key") or (str(err["loc"][0]) if err["loc"] else "")
    kind = err["type"]
    if kind == "settings":  # a rule of ours: already in words
        return key, ctx.get("host", ""), _within(err["loc"]) + err["msg"]
    if kind == "extra_forbidden":
        return key, "", unknown_key(key)
    if kind == "missing":
        return key, "", SAID[kind]
    if kind == "string_pattern_mismatch":
        form = ENV_NAME_FORM if len(err["loc"]) > 1 else FORM.get(key)
        field = HostSettings.model_fields.get(key)
        said = f"must be {form}" if form else f"does not fit: {field.description if field else ctx['pattern']}"
    elif kind in SAID:
        said = SAID[kind].format(**ctx)
    else:  # a kind no setting has met yet: pydantic's own words
        said = err["msg"]
    got = "" if key in UNECHOED else f" (got {err['input']!r})"
    said = f"{_within(err['loc'])}{said}{got}"
    bound = next((name for name in ("ge", "gt", "le", "lt", "min_length") if name in ctx), None)
    why = WHY.get(key) if bound else None
    why = why.get(bound) if isinstance(why, dict) else why
    return key, "", f"{said}: {why}" if why else said


def _first_error(exc: ValidationError) -> tuple[str, str, str]:
    return in_words(exc.errors()[0])


def load_settings(
    inventory,
    inventory_file: str | None = None,
    cwd: str | None = None,
    group_data_dirs: list[str] | tuple[str, ...] = (),
    check_lane: Callable[[Cluster], list[str]] | None = None,
) -> Settings:
    """
    Validate every host's data of a pyinfra ``Inventory`` and build the ``Settings``.

    + inventory_file, cwd, group_data_dirs: where the data came from, as given to pyinfra
      (the same search order as its CLI), so an error can name the file
    + check_lane: a cluster's problems with its lane (``lanes.lane_problems``), blamed on the
      file that sets ``lane``

    Raises ``SettingsError`` naming the file (or ``--data``) and the key.
    """
    base = Path(cwd or Path.cwd())
    dirs = [base / "group_data"]
    if inventory_file:
        inv_dir = (base / inventory_file).resolve().parent / "group_data"
        if inv_dir != dirs[0].resolve():
            dirs.append(inv_dir)
    dirs += [base / d for d in group_data_dirs]
    sources = _Sources(inventory, inventory_file, dirs, base)

    hosts = list(inventory)
    if not hosts:
        raise SettingsError(
            f"inventory {sources.inventory_file} has no hosts: give a group of (name, data) tuples, "
            "as inventory/pair.py does"
        )
    seen: dict[str, str] = {}
    for host in hosts:
        said = host_name_problem(host.name)
        if not said and host.name.lower() in seen:
            said = (
                f"its name differs from {seen[host.name.lower()]}'s only in case: SSH, DNS and the "
                "cluster's files would take them for one node"
            )
        if said:
            raise _error(sources.inventory_file, "", host.name, said)
        seen[host.name.lower()] = host.name
    per_host: dict[str, HostSettings] = {}
    connection: dict[str, tuple[str, str]] = {}
    for host in hosts:
        data = _host_data(inventory, host)
        ours = {k: v for k, v in data.items() if not k.startswith("_") and k not in _SSH_KEYS}
        try:
            per_host[host.name] = HostSettings.model_validate(ours)
        except ValidationError as exc:
            key, _, message = _first_error(exc)
            source = (exc.errors()[0].get("ctx") or {}).get("source") or key
            raise _error(sources.of(host, source), key, host.name, message) from None
        ssh_host = data.get("ssh_hostname") or host.name
        ssh_user = data.get("ssh_user") or "root"
        connection[host.name] = (str(ssh_host), str(ssh_user))

    by_cluster: dict[str, list] = {}
    for host in hosts:
        by_cluster.setdefault(per_host[host.name].cluster, []).append(host)

    clusters: dict[str, Cluster] = {}
    for name, members in by_cluster.items():
        first = per_host[members[0].name]
        for host in members[1:]:
            for key in CLUSTER_KEYS:
                if getattr(per_host[host.name], key) != getattr(first, key):
                    # Blame the side set in the more specific layer (the odd one out).
                    odd, other = host, members[0]
                    if sources.layer(members[0], key)[0] > sources.layer(host, key)[0]:
                        odd, other = members[0], host
                    raise _error(
                        sources.of(odd, key),
                        key,
                        odd.name,
                        f"{getattr(per_host[odd.name], key)!r} differs from "
                        f"{getattr(per_host[other.name], key)!r} on {other.name}: every node of "
                        f"cluster {name} must agree",
                    )
        nodes = []
        for host in members:
            try:
                nodes.append(Node(
                    name=host.name,
                    ssh_host=connection[host.name][0],
                    ssh_user=connection[host.name][1],
                    rank=per_host[host.name].rank,
                    fabric_ip=per_host[host.name].fabric_ip,
                ))
            except ValidationError as exc:
                field, _, message = _first_error(exc)
                key = NODE_KEYS.get(field, field)
                source = sources.of(host, key) if key else sources.inventory_file
                raise _error(source, key, host.name, message) from None
        try:
            clusters[name] = Cluster(
                name=name,
                nodes=tuple(sorted(nodes, key=lambda n: n.rank)),
                fabric=Fabric(
                    interface=first.fabric_interface,
                    subnet=first.fabric_subnet,
                    mtu=first.fabric_mtu,
                    rdma_devices=tuple(first.rdma_devices),
                    rdma_port=first.rdma_port,
                    twin=first.fabric_twin_interface,
                    twin_subnet=first.fabric_twin_subnet,
                ),
                config=first,
            )
        except ValidationError as exc:
            key, host_name, message = _first_error(exc)
            host = inventory.get_host(host_name) if host_name else members[0]
            raise _error(sources.of(host, key), key, host.name, message) from None
        problems = check_lane(clusters[name]) if check_lane and first.lane else []
        if problems:
            head = inventory.get_host(clusters[name].head.name)
            raise _error(sources.of(head, "lane"), "lane", head.name, "; ".join(problems))
    return Settings(clusters=clusters)
