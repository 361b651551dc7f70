#!/usr/bin/python3 -Xstand-in=sparkinfra-test-bed
"""
STAND-IN (sparkinfra test bed): /proc/meminfo as a DGX OS kernel shows it, with the CMA area's
``CmaTotal``/``CmaFree`` lines this machine's kernel does not have (the way LXCFS overmounts a
container's meminfo). Every other line is the real file's, read again every 2 s. The area's size
in kB is /etc/sparkbed/cma-kib: a fault writes 0, the kernel 7.0.0-1019 the field met, where
``ibv_reg_mr`` fails with ENOMEM.
"""

import subprocess
import time
from pathlib import Path

REAL = Path("/run/sparkbed/meminfo.real")  # the kernel's own file, bound here before it is covered
SHOWN = Path("/run/sparkbed/meminfo")
PROC = Path("/proc/meminfo")
CMA = Path("/etc/sparkbed/cma-kib")
READY = Path("/run/sparkbed/meminfo_ready")


def mount(*args):
    subprocess.run(["mount", *args], check=True)


def render() -> str:
    lines = [line for line in REAL.read_text().splitlines() if not line.startswith("Cma")]
    try:
        kib = int(CMA.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        kib = 0
    cma = [f"CmaTotal:       {kib:8d} kB", f"CmaFree:        {kib:8d} kB"]
    at = next((i for i, line in enumerate(lines) if line.startswith("HugePages_Total")), len(lines))
    return "\n".join(lines[:at] + cma + lines[at:]) + "\n"


def main():
    SHOWN.parent.mkdir(parents=True, exist_ok=True)
    if not REAL.exists():
        REAL.touch()
        mount("--bind", str(PROC), str(REAL))
    SHOWN.write_text(render())
    mount("--bind", str(SHOWN), str(PROC))
    READY.touch()
    while True:
        time.sleep(2)
        text = render()
        with SHOWN.open("r+") as out:  # in place: the bind holds this inode
            out.write(text)
            out.truncate()


if __name__ == "__main__":
    main()
