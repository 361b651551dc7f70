"""
Files of a node: rendered from templates, a block in a file, a secret env file; each read with
one fact, uploaded only when it differs.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
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
from pyinfra.facts.files import Block, File, FileContents
from pyinfra.operations import files
from pyinfra.operations.util.files import chmod, chown, generate_color_diff

from .. import project
from ..facts.files import FileState
from ..facts.reading import gathered

TEMPLATES = project.TEMPLATES


def render(template: str, **values) -> str:
    """
    The text of ``templates/<template>`` rendered with ``values``, by the same Jinja2 set-up as
    pyinfra's ``files.template``.
    """
    return get_template(str(TEMPLATES / template)).render(values)


def preparing() -> bool:
    """True while pyinfra only detects changes (its prepare stage), before anything runs."""
    return host.state.current_stage != StateStage.Execute


def refuse(message: str):
    """Stop this operation on this host with ``message``: an error while preparing, a failing
    command (its message in pyinfra's output, no traceback) while running."""
    if preparing():
        raise OperationError(message)
    yield StringCommand("sh", "-c", QuoteString(f"echo {shlex.quote(message)} >&2; exit 1"))


@operation()
def file_content(path: str, content: str | None = None, src: str | None = None,
                 user: str = "root", group: str = "root", mode: str = "644", present: bool = True):
    """
    Ensure ``path`` holds ``content`` with this owner and mode, read with one command (pyinfra's
    ``files.put`` asks three facts per file: most of a node's round trips in a no-op converge).
    Uploads only when the content differs; with ``--diff``, prints the change as a unified diff.

    + path: the file on the node (its folder is made if missing)
    + content: the text it must hold
    + src: or a file on the controller whose bytes it must hold (a library: no diff is printed)
    + user, group, mode: its owner and mode (octal, ``"600"``)
    + present: whether the file must exist (``False``: removed; ``content`` and ``src`` unused)
    """
    now = gathered(host, FileState, path=path)
    if not present:
        if now["kind"] == "absent":
            host.noop(f"{path} is absent")
        else:
            yield StringCommand("rm", "-f", QuoteString(path))
        return
    if now["kind"] == "other":
        yield from refuse(f"{host.name}: {path} is not a regular file; remove it, sparkinfra writes a file there")
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
    private = int(mode, 8) & 0o077 == 0
    if context.state.config.DIFF and src is None:
        host.log(f"Will {'modify' if now['kind'] == 'file' else 'create'} {path}", logger.info)
        if private:  # root-only: what it holds may be secret
            logger.info("  (a root-only file: its lines are not shown)")
        else:
            before = (host.get_fact(FileContents, path=path) or []) if now["kind"] == "file" else []
            for line in generate_color_diff([line + "\n" for line in before], content.splitlines(keepends=True)):
                logger.info("  %s", line)
        logger.info("")
    if not now["parent"]:
        yield StringCommand("mkdir", "-p", QuoteString(os.path.dirname(path)))
    if private:
        data = Path(src).read_bytes() if src is not None else content.encode()

        def upload(state, host):
            return put_private(host, data, path, mode, user, group)

        yield FunctionCommand(upload, (), {})
        return
    source = src if src is not None else io.StringIO(content)
    yield FileUploadCommand(source, path, remote_temp_filename=host.get_temp_filename(path))
    yield chown(path, user, group)
    yield chmod(path, mode)


@operation()
def text_block(path: str, marker: str, content: str = "", present: bool = True):
    """
    Ensure ``path`` holds ``content`` between ``marker``'s BEGIN and END lines, the rest of the
    file as it is: pyinfra's ``files.block``, called only when the block differs (it reads its
    fact twice and warns that it is beta on every run).

    + path: the file
    + content: the block's lines
    + marker: the markers' text, ``{mark}`` standing for BEGIN or END
    + present: whether the block must be there (``False``: removed with its markers)
    """
    now = gathered(host, Block, path=path, marker=marker, begin=None, end=None)
    if not present:
        if not now:
            host.noop(f"{path} holds no such block")
            return
        yield from files.block._inner(path=path, marker=marker, present=False)
        return
    if now == content.split("\n"):
        host.noop(f"{path} holds the block")
        return
    yield from files.block._inner(path=path, content=content, marker=marker)


# Secrets
# -------


@contextlib.contextmanager
def private_folder(host):
    """
    A folder only the SSH user can enter (``mktemp -d`` as that user), removed on leaving; None if
    it could not be made.
    """
    ok, output = host.run_shell_command(StringCommand("mktemp", "-d"), _sudo=False)
    private = output.stdout.strip() if ok else ""
    if not private.startswith("/"):
        yield None
        return
    try:
        yield private
    finally:
        host.run_shell_command(StringCommand("rm", "-rf", QuoteString(private)), _sudo=False)


def put_private(host, content: str | bytes, path: str, mode: str = "600", user: str = "root",
                group: str = "root") -> bool:
    """
    Upload ``content`` into ``path`` so that no one but its owner can read it at any moment:
    pyinfra's sudo upload passes through a temp file the SSH user writes (``/tmp`` by default,
    readable by others); here that file is in a ``private_folder``, and the destination has its
    owner and mode before the copy fills it.
    """
    made = StringCommand("install", "-m", mode, "-o", user, "-g", group, "/dev/null", QuoteString(path))
    if not host.run_shell_command(made, _sudo=True)[0]:
        return False
    data = io.BytesIO(content) if isinstance(content, bytes) else io.StringIO(content)
    with private_folder(host) as private:
        return bool(private) and host.put_file(data, path, remote_temp_filename=f"{private}/upload", _sudo=True)


def put_secret(host, content: str, path: str) -> bool:
    """Upload a secret into a root-only 0600 file (``put_private``)."""
    return put_private(host, content, path)


def same_on_node(host, content: str, path: str) -> bool:
    """
    Whether ``path`` holds ``content``, compared on the node (``cmp``): the value goes up into a
    ``private_folder`` and is removed at once. No digest of it is computed, so none can reach
    pyinfra's output (``-vvv`` prints every fact's answer) to be tested offline.
    """
    with private_folder(host) as private:
        if not private or not host.put_file(io.StringIO(content), f"{private}/candidate", _sudo=False):
            return False
        same, _ = host.run_shell_command(
            StringCommand("cmp", "-s", QuoteString(path), QuoteString(f"{private}/candidate")), _sudo=True)
        return same


@operation()
def secret_env_file(path: str, variable: str, env: str, present: bool = True):
    """
    Ensure a root-only (0600) env file holds ``VARIABLE=<value of the controller's $env>``. The
    value is compared on the node (``same_on_node``) and uploaded by a function command: neither it
    nor anything derived from it appears in pyinfra's output, ``--diff``, ``--debug`` or
    ``--json``, nor on a command line.

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
        yield from refuse(f"{host.name}: the controller's ${env} is empty; it must hold the secret for {path}")
        return
    content = f"{variable}={value}\n"
    info = gathered(host, File, path=path)
    # The value is compared on the node, once the run executes (preparing, a private file of the
    # right mode counts as current: a --dry run does not say that a rotated secret changes).
    if info and info.get("mode") == 600 and info.get("user") == "root" and (
        preparing() or same_on_node(host, content, path)
    ):
        host.noop(f"{path} holds the current secret")
        return

    def upload(state, host):
        # The folder is root-only before the secret is in it; the file is 0600 before it is filled.
        folder = str(Path(path).parent)
        host.run_shell_command(StringCommand("install", "-d", "-m", "755", folder), _sudo=True)
        return put_secret(host, content, path)

    yield FunctionCommand(upload, (), {})
