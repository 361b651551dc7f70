"""
The NCCL library a node holds: its version, read from the library itself.
"""

from __future__ import annotations

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
