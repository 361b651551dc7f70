"""
Helper for unit tests: ``libnccl.so.2`` stand-ins compiled here, of one version but another build
(other bytes, another ELF build-id) when ``flavor`` differs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

C_SOURCE = """
const char flavor[] = FLAVOR;
int ncclGetVersion(int *version) { *version = CODE; return 0; }
"""


def compile_build(out: Path, flavor: str, code: int = 23007) -> Path:
    """A libnccl.so.2 stand-in whose ncclGetVersion reports ``code``; ``flavor`` makes another build."""
    out.parent.mkdir(parents=True, exist_ok=True)
    source = out.parent / f"{out.name}.c"
    source.write_text(C_SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--build-id=sha1", "-Wl,-soname,libnccl.so.2",
                    f'-DFLAVOR="{flavor}"', f"-DCODE={code}", "-o", str(out), str(source)], check=True)
    return out
