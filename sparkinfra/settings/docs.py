"""
``docs/settings.md``, generated from the settings model: one row a Field (its type, default and
description; the ``vllm serve`` flag it renders), under the page's fixed text.

    python -m sparkinfra.settings --docs > docs/settings.md
"""

from __future__ import annotations

import types
import typing
from ipaddress import IPv4Address, IPv4Network
from typing import Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from .loader import FORM
from .model import HostSettings, serve_flag
from .rules import Form

COMMAND = "python -m sparkinfra.settings --docs > docs/settings.md"

INTRO = f"""\
# Settings

Every key a host's data may hold, with its type, default and meaning. Generated from the model
(`sparkinfra/settings/model.py`, each key one `Field` with its description) by `{COMMAND}`;
`tests/unit/test_docs.py` fails when this page is stale. A setting that reaches `vllm serve` names
its flag in its Field (`json_schema_extra={{"serve": ...}}`): every lane renders it, a lane's `serve`
cannot set it, and its row here says so.

One pydantic model, `sparkinfra.settings.HostSettings` (unknown keys are errors), read from each host's
data exactly as pyinfra layers it: `--data` > inventory host data > `group_data/<group>.py` and
inventory groups > `group_data/all.py`. Keys starting with `_` (pyinfra's operation arguments, e.g.
`_sudo`) and pyinfra's `ssh_*` connection keys pass through to pyinfra. Cluster keys must agree on every
node of a cluster; a cluster needs ranks `0..N-1` (0 is the head) and distinct fabric addresses inside
the fabric subnet; the head's `api_port`, `master_port` and `stage_port` differ; `teardown=full` needs
`teardown_confirm` set to the cluster's name.

Values are checked for where they go (`sparkinfra/settings/rules.py`; they are also quoted there). Node
names are unique ignoring case; they, `cluster`, `lane` and `container_name` are names, never paths:
letters, digits, `_`, `.` and `-`, starting with a letter or digit, no `..` (a lane is the file
`lanes/<lane>.yaml`, named). `ssh_user` is a login name as ssh_config's `User` line and
`authorized_keys` take it (those characters, not starting with `-` or `.`, at most 32); `ssh_hostname`
an IPv4 address or a DNS name. `fabric_interface` and `rdma_devices` follow Linux's rules (at most 15
characters, IFNAMSIZ, or 63 for an RDMA device; no `/`, `:` or whitespace; not `.` or `..`), in the same
characters (they go into unit files, netplan and sysfs paths). `model` and `drafter` are Hub ids
`owner/name` as the Hub allows them; revisions are commits, branches or tags without `..`; `image` is a
reference docker takes; paths on the nodes are absolute, without `..`, `:`, `,` or spaces (docker's
`-v`, `LD_PRELOAD`); env values fit on one line. A value out of bounds says why the bound is there
(`WHY` in `sparkinfra/settings/model.py`), and an unknown key names the nearest known one.

Settings that are each valid but do not fit together are refused before any connection, naming both
keys: two ports of the head that are the same (`api_port`, `master_port`, `stage_port`, a lane's);
`fabric_twin_interface` that is `fabric_interface`; `fabric_twin_subnet` overlapping `fabric_subnet`
or link-local; `NCCL_*` in `lane_env` (they go in `nccl_env_overrides`); `gpu_clock_cap` MIN above
MAX; `teardown=full` without `teardown_confirm` naming the cluster; two nodes with one address or
twin address, an address outside its subnet, no rank 0; an `api_key_env` whose variable this shell
does not hold, or holds empty, for a deploy that serves or asks the API (`serve`, `lane`, `bench`,
`tune`); the lane against the cluster (its `nodes` and parallelism against the node
count, its `drafter` against the setting `drafter`, its model against `model`:
[lanes.md](lanes.md)). Only the Hub knows whether a model is gated or private: its refusal (401,
403) names `hf_token_env`'s variable, unset or refused, at the lock's resolution and at the download.
"""

_BOUNDS = {annotated_types.Ge: ("ge", "≥"), annotated_types.Gt: ("gt", ">"), annotated_types.Le: ("le", "≤"),
           annotated_types.Lt: ("lt", "<")}


def _bounds(metadata: list) -> str:
    """`` ≥ 1``, `` 1..64`` (both ends inclusive), `` > 0, ≤ 1``, or nothing."""
    found = {type(m): getattr(m, _BOUNDS[type(m)][0]) for m in metadata if type(m) in _BOUNDS}
    if annotated_types.Ge in found and annotated_types.Le in found and len(found) == 2:
        return f" {found[annotated_types.Ge]}..{found[annotated_types.Le]}"
    return ",".join(f" {_BOUNDS[kind][1]} {value}" for kind, value in found.items())


def type_text(annotation: Any, metadata: list = (), key: str = "") -> str:
    """How the page says a setting's type: its ``Form``, else its pattern's form (``FORM``), else
    from the annotation (bounds, ``Literal`` choices, lists, mappings, null)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *inner = typing.get_args(annotation)
        for item in inner:  # a Field inside Annotated holds its bounds as metadata
            metadata = [*metadata, *(item.metadata if isinstance(item, FieldInfo) else [item])]
    form = next((m for m in metadata if isinstance(m, Form)), None)
    if form:
        return form.said
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [type_text(a, metadata, key) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"dict {type_text(args[0])}→{type_text(args[1])}"
    if annotation is str:
        return FORM.get(key, "str")
    names = {IPv4Address: "IPv4 address", IPv4Network: "IPv4 network"}
    if annotation in names:
        return names[annotation]
    return annotation.__name__ + _bounds(list(metadata))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "null"
    if value == "":
        return "empty"
    return f"`{value}`"


def meaning(field: FieldInfo) -> str:
    """The Field's description, and the ``vllm serve`` flag it renders."""
    flag = serve_flag(field)
    if not flag:
        return field.description or ""
    return f"{field.description} Reaches every lane's `vllm serve --{flag.replace('_', '-')}`."


def settings_page() -> str:
    """The whole of ``docs/settings.md``."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, field in HostSettings.model_fields.items():
        kind = type_text(field.annotation, field.metadata, key)
        rows.append(f"| `{key}` | {kind} | {_default(field)} | {meaning(field)} |")
    return INTRO + "\n" + "\n".join(rows) + "\n"
