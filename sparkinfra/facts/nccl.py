"""
The NCCL library a node holds: its version, read from the library itself.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override


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


class NcclPin(FactBase):
    """
    Returns the pinned library's sha256 (``None``: no such file) and the identity record written
    beside it when it was placed (``None``: none, or not JSON).

    + path: the library (``nccl_library``)
    + record: its record (``/etc/sparkinfra/nccl-pin.json``)

    .. code:: python

        {"sha256": "3f2a...", "record": {"version": "2.30.7", "sha256": "3f2a...", "build_id": "9c1e...",
                                         "source": {"index": "https://pypi.org/simple", ...}}}
    """

    @override
    def command(self, path: str, record: str) -> StringCommand:
        return StringCommand(
            "(", "sha256sum", QuoteString(path), "2>/dev/null", "||", "echo", "-", ";",
            "cat", QuoteString(record), "2>/dev/null", ";", "true", ")",
        )

    @override
    def process(self, output):
        return parse_pin(output)


def parse_pin(lines) -> dict:
    """Parse ``NcclPin``'s output: ``sha256sum``'s line (or ``-``), then the record's JSON."""
    lines = list(lines)
    first = lines[0].split() if lines else []
    digest = first[0] if first and len(first[0]) == 64 else None
    try:
        record = json.loads("\n".join(lines[1:])) if len(lines) > 1 else None
    except ValueError:
        record = None
    return {"sha256": digest, "record": record if isinstance(record, dict) else None}
