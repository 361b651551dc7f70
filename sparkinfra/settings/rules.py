"""
The rules of a setting's value, for where it goes: each ``*_problem`` says, in words, what is wrong
with a value (None: nothing); ``checked`` makes one a str field's rule; ``rule`` is a broken rule
about a key, as the loader reports it.

Values are still quoted where they are used; these rules keep out what quoting cannot make right (a
path for a name, a space in an ssh_config line, a name the kernel or docker refuses).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError


def rule(key: str, message: str, host: str | None = None, source: str | None = None) -> PydanticCustomError:
    """A broken rule about ``key``; ``source``: the key whose file (or ``--data``) the error names,
    when not ``key``'s own (a rule one key breaks by being left unset)."""
    return PydanticCustomError("settings", message, {"key": key, "host": host or "", "source": source or key})


ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # an environment variable's name
SAFE = "letters, digits, '_', '.' and '-'"
_SAFE = re.compile(r"[A-Za-z0-9_.-]+")


def _odd_character(value: str, allowed: re.Pattern[str]) -> str | None:
    """The first character of ``value`` outside ``allowed`` (one-character matches), shown."""
    for char in value:
        if not allowed.fullmatch(char):
            return "a space" if char == " " else f"{char!r}"
    return None


def name_problem(value: str, what: str, limit: int, goes: str) -> str | None:
    """
    A name that becomes a file or folder name, a unit name or a word of a command: ``SAFE``
    characters, starting with a letter or digit, no ``..``, at most ``limit`` characters.

    + what: the thing named (``a lane's name``); goes: where it goes, said in the refusal
    """
    if not value:
        return f"{what} cannot be empty ({goes})"
    if "/" in value:
        return f"{value!r} is a path, not a name: {what} has no '/' ({goes})"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: {what} takes {SAFE} ({goes})"
    if not value[0].isalnum():
        return f"{value!r} starts with {value[0]!r}: {what} starts with a letter or digit ({goes})"
    if ".." in value:
        return f"{value!r} holds '..': {what} is a name, not a path ({goes})"
    if len(value) > limit:
        return f"{value!r} is {len(value)} characters: {what} takes at most {limit} ({goes})"
    return None


def device_problem(value: str, what: str, limit: int, why_limit: str, goes: str) -> str | None:
    """
    A kernel device's name: Linux's rules (at most ``limit`` characters, no '/', ':' or
    whitespace, not ``.`` or ``..``), then ``SAFE`` characters only.

    + what: ``a network interface's name``; why_limit: the kernel's constant; goes: where it goes
    """
    if not value or value in (".", ".."):
        return f"{value!r} cannot be {what}: Linux refuses an empty name, '.' and '..'"
    if len(value) > limit:
        return f"{value!r} is {len(value)} characters: Linux takes at most {limit} in {what} ({why_limit})"
    for char in "/:":
        if char in value:
            return f"{value!r} holds {char!r}: Linux refuses it in {what}"
    if any(char.isspace() for char in value):
        return f"{value!r} holds whitespace: Linux refuses it in {what}"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: {what} takes {SAFE} here ({goes})"
    return None


def interface_problem(value: str) -> str | None:
    return device_problem(
        value, "a network interface's name", 15, "IFNAMSIZ", "it goes into the fabric unit, netplan and ip commands"
    )


def rdma_device_problem(value: str) -> str | None:
    return device_problem(
        value, "an RDMA device's name", 63, "IB_DEVICE_NAME_MAX", "it names a folder of /sys/class/infiniband"
    )


def twin_problem(value: str) -> str | None:
    if value in ("", "none"):
        return None
    return interface_problem(value)


def wheel_problem(value: str) -> str | None:
    if value and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
        return f"{value!r} is not a package name (PEP 508: letters, digits, '.', '_', '-')"
    return None


def url_problem(value: str) -> str | None:
    if not re.fullmatch(r"https?://[^\s'\"]+", value):
        return f"{value!r} is not an http(s) URL"
    return None


def container_problem(value: str) -> str | None:
    return name_problem(value, "a container's name", 128, "docker's rule: [a-zA-Z0-9][a-zA-Z0-9_.-]*")


def cluster_problem(value: str) -> str | None:
    return name_problem(value, "a cluster's name", 64, "it names results folders and the mesh key")


def lane_problem(value: str) -> str | None:
    if not value:
        return None
    return name_problem(value, "a lane's name", 100, "it names the file lanes/<lane>.yaml")


def host_name_problem(value: str) -> str | None:
    return name_problem(value, "a node's name", 253, "it is the SSH host too, unless ssh_hostname is set")


def ssh_user_problem(value: str) -> str | None:
    """A login name as ssh_config's ``User`` line and ``authorized_keys`` take it."""
    goes = "it goes into ssh_config's User line and the worker's authorized_keys"
    if not value:
        return f"a login name cannot be empty ({goes})"
    odd = _odd_character(value, _SAFE)
    if odd:
        return f"{value!r} holds {odd}: a login name takes {SAFE} ({goes})"
    if value[0] in "-.":
        return f"{value!r} starts with {value[0]!r}: a login name starts with a letter, digit or '_' ({goes})"
    if len(value) > 32:
        return f"{value!r} is {len(value)} characters: Linux login names take at most 32"
    return None


_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?")


def ssh_host_problem(value: str) -> str | None:
    """An IPv4 address or a DNS name (or an ssh_config alias of the same shape)."""
    said = f"{value!r} is neither an IPv4 address nor a DNS name"
    if not value or len(value) > 253:
        return said
    labels = value.rstrip(".").split(".")
    if all(label.isdigit() for label in labels):
        try:
            IPv4Address(value)
        except ValueError:
            return f"{value!r} is not an IPv4 address"
        return None
    bad = next((label for label in labels if len(label) > 63 or not _LABEL.fullmatch(label)), None)
    if bad is not None:
        part = f": {bad!r} is not a DNS label" if bad != value else ""
        return f"{said}{part} (letters, digits, '-' and '_', not starting or ending with '-', at most 63)"
    return None


_HUB_PART = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def model_id_problem(value: str) -> str | None:
    """A Hub repository id, ``owner/name``, as the Hub allows it (huggingface_hub's rules)."""
    if not value:
        return None
    if value.count("/") != 1:
        return f"{value!r} is not a Hub repository id: owner/name, one '/'"
    for part in value.split("/"):
        if not _HUB_PART.fullmatch(part) or len(part) > 96 or "--" in part or ".." in part:
            return (
                f"{value!r}: {part!r} is not a Hub name ({SAFE}, at most 96, not starting or ending with "
                "'-' or '.', no '--' or '..')"
            )
    if value.endswith(".git"):
        return f"{value!r} ends with '.git': the Hub refuses it"
    return None


_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")


def revision_problem(value: str) -> str | None:
    """A commit, branch or tag of a Hub repository (a git ref's name)."""
    tidy = ".." not in value and "//" not in value and not value.endswith(("/", ".lock"))
    if _REVISION.fullmatch(value) and tidy:
        return None
    return (
        f"{value!r} is not a revision: a commit (40 hex), branch or tag of letters, digits and '/', '_', '.', '-', "
        "starting with a letter or digit, no '..' (it names a folder of the HF cache)"
    )


# docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL_OF_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_LABEL_OF_DOMAIN}(?:\.{_LABEL_OF_DOMAIN})*(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def image_problem(value: str) -> str | None:
    if _IMAGE.fullmatch(value):
        return None
    return (
        f"{value!r} is not an image reference docker takes: [registry/]name[:tag][@sha256:digest], "
        "the name in lowercase letters, digits and '.', '_', '-' separators"
    )


_PATH = re.compile(r"[A-Za-z0-9_.+@/-]")


def node_path_problem(value: str) -> str | None:
    """A path on the nodes, as docker's ``-v``, ``LD_PRELOAD`` and shell commands take it."""
    goes = "it goes into docker's -v, LD_PRELOAD and commands, where ':', ',' and spaces separate"
    if not value.startswith("/"):
        return f"{value!r} is not an absolute path (a path on the nodes starts with '/')"
    odd = _odd_character(value, _PATH)
    if odd:
        said = "a path on the nodes takes letters, digits and '/', '_', '.', '-', '+', '@'"
        return f"{value!r} holds {odd}: {said} ({goes})"
    if ".." in value.split("/"):
        return f"{value!r} holds '..': give the folder itself"
    return None


def tarball_problem(value: str) -> str | None:
    return node_path_problem(value) if value else None


def env_value_problem(value: str) -> str | None:
    """A value of an env file line (docker's ``--env-file``, systemd's ``EnvironmentFile=``)."""
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        return f"{value!r} holds a control character (a line break?): an env file holds one variable a line"
    return None


@dataclass(frozen=True)
class Form:
    """How ``docs/settings.md`` says the type of a value a rule checks (``checked``'s ``said``)."""

    said: str


def checked(problem: Callable[[str], str | None], said: str) -> Any:
    """A str checked by ``problem`` (it says what is wrong, in words); ``said``: its type, in the docs."""

    def check(value: str) -> str:
        found = problem(value)
        if found:
            raise PydanticCustomError("settings", found)
        return value

    return Annotated[str, AfterValidator(check), Form(said)]


EnvName = Annotated[str, Field(pattern=f"^{ENV_NAME}$"), Form("env var name")]
EnvValue = checked(env_value_problem, "one-line str")


# The checked kinds of value, each with how the docs say it.
ClusterName = checked(cluster_problem, "name")
LaneName = checked(lane_problem, "lane name or empty")
ContainerName = checked(container_problem, "container name (docker's rule)")
InterfaceName = checked(interface_problem, "interface name (Linux's rules, ≤ 15 chars)")
TwinName = checked(twin_problem, "interface name, `none` or empty")
RdmaDeviceName = checked(rdma_device_problem, "RDMA device name (Linux's rules, ≤ 63 chars)")
NodePath = checked(node_path_problem, "absolute path (nodes)")
Tarball = checked(tarball_problem, "absolute path (head) or empty")
WheelName = checked(wheel_problem, "package name or empty")
Url = checked(url_problem, "http(s) URL")
ImageRef = checked(image_problem, "image reference")
ModelId = checked(model_id_problem, "Hub id `owner/name` or empty")
Revision = checked(revision_problem, "commit, branch or tag")
HostName = checked(host_name_problem, "node name")
SshHost = checked(ssh_host_problem, "IPv4 address or DNS name")
SshUser = checked(ssh_user_problem, "login name")
ControllerPath = Annotated[str, Form("path (controller)")]
ShellCommand = Annotated[str, Form("shell command")]
