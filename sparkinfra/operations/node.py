"""
The node programs (``sparkinfra/node``): one folder, placed whole at ``paths.PROGRAMS`` by one
operation, the one way sparkinfra's own programs reach a node.
"""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from .. import node
from ..facts.files import FolderDigests
from ..facts.reading import gathered
from ..node.paths import PROGRAMS


def programs() -> dict[str, str]:
    """Each file of the node programs on the controller, by its path in the folder: its sha256."""
    return {str(f.relative_to(node.DIR)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in node.files()}


@operation()
def programs_present(present: bool = True):
    """
    Ensure ``paths.PROGRAMS`` holds the node programs, file for file (read with one command); a file
    it holds that they do not is removed.

    + present: whether the folder must exist (``False``: removed)
    """
    now = gathered(host, FolderDigests, path=PROGRAMS)
    if not present:
        if now:
            yield StringCommand("rm", "-rf", QuoteString(PROGRAMS))
        else:
            host.noop(f"{PROGRAMS} is absent")
        return
    wanted = programs()
    if now == wanted:
        host.noop(f"{PROGRAMS} holds the node programs")
        return
    folders = sorted({f"{PROGRAMS}/{name}".rpartition("/")[0] for name in wanted})
    yield StringCommand("mkdir", "-p", *map(QuoteString, folders))
    for name in sorted(set(now) - set(wanted)):
        yield StringCommand("rm", "-f", QuoteString(f"{PROGRAMS}/{name}"))
    for name, digest in sorted(wanted.items()):
        if now.get(name) != digest:
            yield FileUploadCommand(str(node.DIR / name), f"{PROGRAMS}/{name}")
    yield StringCommand("chmod", "-R", "u=rwX,go=rX", QuoteString(PROGRAMS))
