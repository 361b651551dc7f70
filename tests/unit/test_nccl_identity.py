"""
``node/nccl_identity.py``: the build-id of real ELF files as readelf reads it, and of hand-made
ELF32 big-endian and ELF64 section-only files; two libnccl.so.2 stand-ins of one version but
another build (compiled here) told apart; what a running process has mapped.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nccl_builds import compile_build

from sparkinfra import node

SOURCE = node.DIR / "nccl_identity.py"
sys.path.insert(0, str(SOURCE.parent))
ni = importlib.import_module("nccl_identity")  # the node script, as a module

@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """Two builds of 2.30.7 (``a``, ``b``) and a 2.29.7, each a libnccl.so.2 in its own folder."""
    root = tmp_path_factory.mktemp("builds")
    return {"a": compile_build(root / "a" / "libnccl.so.2", "a"), "b": compile_build(root / "b" / "libnccl.so.2", "b"),
            "old": compile_build(root / "old" / "libnccl.so.2", "a", 22907)}


def readelf_build_id(path: str) -> str:
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID:" in line)


@pytest.mark.skipif(not shutil.which("readelf"), reason="no readelf (binutils)")
def test_build_id_of_real_files_is_readelfs():
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6", "/usr/lib/libc.so.6") if os.path.exists(p))
    for path in (os.path.realpath(shutil.which("ls")), libc):
        assert ni.build_id(path) == readelf_build_id(path), path


def test_a_file_that_is_not_elf_has_none(tmp_path):
    (tmp_path / "text").write_text("#!/bin/sh\necho not elf\n")
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert ni.build_id(tmp_path / "text") is None and ni.build_id(tmp_path / "short") is None


def note(name: bytes, kind: int, desc: bytes, order: str, align: int = 4) -> bytes:
    def padded(b: bytes, at: int) -> bytes:
        return b + b"\0" * (-(at + len(b)) % align)
    head = struct.pack(order + "III", len(name), len(desc), kind)
    body = padded(name, 12)
    return head + body + padded(desc, 0)


def elf32_big_endian(notes: bytes) -> bytes:
    """An ELF32 big-endian file: its header, one PT_NOTE program header, the notes."""
    ident = b"\x7fELF" + bytes([1, 2, 1]) + b"\0" * 9
    header = ident + struct.pack(">HHIIIIIHHHHHH", 3, 8, 1, 0, 52, 0, 0, 52, 32, 1, 40, 0, 0)
    phdr = struct.pack(">IIIIIIII", 4, 84, 0, 0, len(notes), len(notes), 4, 4)
    return header + phdr + notes


def elf64_sections_only(notes: bytes) -> bytes:
    """An ELF64 little-endian file with no program header: a null section and an SHT_NOTE one."""
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    shoff = 64 + len(notes) + (-len(notes) % 8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 2, 0)
    body = notes + b"\0" * (-len(notes) % 8)
    null = b"\0" * 64
    section = struct.pack("<IIQQQQIIQQ", 0, 7, 2, 0, 64, len(notes), 0, 0, 4, 0)
    return header + body + null + section


def test_build_id_of_hand_made_elf_files(tmp_path):
    wanted = bytes(range(1, 21))
    abi = note(b"GNU\0", 1, struct.pack(">IIII", 0, 3, 2, 0), ">")  # another note first
    (tmp_path / "be32").write_bytes(elf32_big_endian(abi + note(b"GNU\0", 3, wanted, ">")))
    assert ni.build_id(tmp_path / "be32") == wanted.hex()
    (tmp_path / "le64").write_bytes(elf64_sections_only(note(b"GNU\0", 3, wanted[:8], "<")))
    assert ni.build_id(tmp_path / "le64") == wanted[:8].hex()
    (tmp_path / "other").write_bytes(elf32_big_endian(note(b"XYZ\0", 3, wanted, ">")))
    assert ni.build_id(tmp_path / "other") is None


def test_notes_aligned_to_eight_are_read():
    """A 64-bit PT_NOTE of p_align 8 (``.note.gnu.property`` and a build-id after it)."""
    prop = note(b"GNU\0", 5, b"\1" * 12, "<", 8)
    data = prop + note(b"GNU\0", 3, b"\xab" * 20, "<", 8)
    assert [kind for _, kind, _ in ni._notes(data, "<", 8)] == [5, 3]
    assert ni._build_id_in(data, "<", (8, 4)) == "ab" * 20


def test_one_version_two_builds(builds):
    a, b = ni.identity(str(builds["a"]), version=True), ni.identity(str(builds["b"]), version=True)
    assert a["version"] == b["version"] == "2.30.7"
    assert a["build_id"] and b["build_id"] and a["build_id"] != b["build_id"] and a["sha256"] != b["sha256"]
    assert a["build_id"] == readelf_build_id(str(builds["a"])) if shutil.which("readelf") else True
    assert not ni.same_build(a, b) and ni.same_build(a, ni.identity(str(builds["a"])))
    assert ni.describe_difference(b, a) == (
        f"2.30.7 but another build (build-id {b['build_id'][:12]}, sha256 {b['sha256'][:12]}), "
        f"the pin is build-id {a['build_id'][:12]} sha256 {a['sha256'][:12]}")
    old = ni.identity(str(builds["old"]), version=True)
    assert old["version"] == "2.29.7" and ni.describe_difference(old, a).startswith("2.29.7 (build-id ")
    assert ni.describe_difference(a, a).startswith("the pin's build (")


def test_same_build_is_the_bytes_not_the_build_id():
    """A stripped or patched copy keeps its build-id: only the sha256 says it is the same file."""
    assert not ni.same_build({"build_id": "ab", "sha256": "1"}, {"build_id": "ab", "sha256": "2"})
    assert ni.same_build({"build_id": None, "sha256": "1"}, {"build_id": "ab", "sha256": "1"})
    assert not ni.same_build({"error": "no such file"}, {"error": "no such file"})


def test_a_missing_file_and_versions(tmp_path):
    assert ni.identity(str(tmp_path / "none")) == {"path": str(tmp_path / "none"), "error": "no such file"}
    assert ni.identity(str(tmp_path / "none"), version=True).keys() == {"path", "error"}
    assert ni.version_text(23007) == "2.30.7" and ni.version_text(2804) == "2.8.4"
    assert ni.nccl_version(str(tmp_path / "none")) is None
    assert len(ni.sha256("/dev/null")) == 64


def test_the_cli_from_a_file_and_from_stdin(builds):
    done = subprocess.run([sys.executable, str(SOURCE), "--version", str(builds["a"]), "/nonexistent"],
                          capture_output=True, text=True, check=True)
    a, missing = json.loads(done.stdout)
    assert a["version"] == "2.30.7" and missing == {"path": "/nonexistent", "error": "no such file"}
    done = subprocess.run([sys.executable, "-", str(builds["b"])], input=SOURCE.read_text(),
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)[0]["sha256"] == ni.sha256(str(builds["b"]))


@pytest.fixture
def loader(builds, tmp_path):
    """A process that loaded build ``a`` and one that loaded none, sleeping: ``MARKER-loader`` and
    ``MARKER-plain`` in their argv."""
    marker = f"nccl-live-{os.getpid()}-{tmp_path.name}"
    code = "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); print('loaded', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code, str(builds["a"]), marker + "-loader"],
                             stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker + "-plain"])
    try:
        assert child.stdout.readline().strip() == "loaded"
        time.sleep(0.1)
        yield marker, child.pid, plain.pid
    finally:
        for p in (child, plain):
            p.kill()
            p.wait()


def test_live_mappings_of_a_running_process(loader, builds):
    marker, pid, plain = loader
    found = ni.live_mappings(marker.upper())  # case-insensitive: vLLM's workers are VLLM::Worker…
    mine = [e for e in found if e["pid"] == pid]
    assert len(mine) == 1, found
    entry = mine[0]
    assert entry["path"] == str(builds["a"]) and entry["sha256"] == ni.sha256(str(builds["a"]))
    assert entry["build_id"] == ni.build_id(str(builds["a"])) and entry["read"] in ("map_files", "root", "path")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert entry["cmd"] == cmdline[:120] and len(entry["cmd"]) == 120
    assert [e for e in found if e["pid"] == plain] == [{"pid": plain, "cmd": f"{sys.executable} -c import time; "
                                                        f"time.sleep(60) {marker}-plain", "path": None}]
    assert all(e["pid"] != os.getpid() for e in found)


def test_the_live_cli_against_a_pin(loader, builds):
    marker, pid, _ = loader

    def live(pin, match):
        done = subprocess.run([sys.executable, "-", "--live", "--match", match, "--pin", str(pin)],
                              input=SOURCE.read_text(), capture_output=True, text=True, check=False)
        return done.returncode, json.loads(done.stdout)

    rc, out = live(builds["a"], marker + "-loader")
    assert rc == 0 and out["pin"]["sha256"] == ni.sha256(str(builds["a"])), out
    assert [p["pid"] for p in out["processes"]] == [pid]
    rc, out = live(builds["b"], marker + "-loader")
    assert rc == 1 and out["processes"][0]["sha256"] != out["pin"]["sha256"]
    assert live(builds["a"], marker)[0] == 1  # the plain process mapped none
    assert live(str(builds["a"]) + ".missing", marker + "-loader")[0] == 1
    assert live(builds["a"], "no such process anywhere")[0] == 1


def test_mapped_nccl_reads_maps_lines():
    maps = ("0040000-0041000 r-xp 00000000 08:01 1 /usr/bin/python3\n"
            "7f0000001000-7f0000002000 r--p 00000000 08:01 2 /opt/nccl/lib/libnccl.so.2\n"
            "7f0000002000-7f0000003000 r-xp 00001000 08:01 2 /opt/nccl/lib/libnccl.so.2\n"
            "7f0000004000-7f0000005000 r--p 00000000 08:01 3 /usr/lib/libnccl.so.2.28.3 (deleted)\n"
            "7f0000006000-7f0000007000 r--p 00000000 08:01 4 /usr/lib/libnccl-net.so\n"
            "7f0000008000-7f0000009000 rw-p 00000000 00:00 0 \n")
    assert ni.mapped_nccl(maps) == [("/opt/nccl/lib/libnccl.so.2", "7f0000001000-7f0000002000", False),
                                    ("/usr/lib/libnccl.so.2.28.3", "7f0000004000-7f0000005000", True)]
