"""
The identity of a shared library, not its version string (stdlib only, any python3 >= 3.8: runs on
the nodes, inside any image, and from stdin). Two builds of one NCCL version can differ, and a
TP=2 rank hangs on the mix; the file's bytes say which build it is.

    python3 nccl_identity.py [--version] FILE...      # a JSON list of identities
    python3 nccl_identity.py --live [--match vllm] [--pin PATH]
    docker exec -i CONTAINER python3 - --live --pin /opt/nccl/lib/libnccl.so.2 < nccl_identity.py

An identity is ``{"path", "sha256", "build_id"}`` (``"version"`` too with ``--version``:
``ncclGetVersion``, which loads the library and so runs its constructors), or ``{"path",
"error"}``. The sha256 is the identity: two files are the same build only when their sha256 are
equal. The ELF build-id (``NT_GNU_BUILD_ID``) is what a person is shown, short (12 hex), beside it:
equal build-ids with different bytes (a stripped copy, a patched one) are not the same file.

``--live`` prints ``{"pin": identity of PATH or null, "processes": [...]}``: every process whose
command line holds ``--match`` (case-insensitive: vLLM names its workers ``VLLM::Worker…``), one
entry per distinct ``libnccl.so*`` file it has mapped, ``{"pid", "cmd", "path", "sha256",
"build_id", "read"}`` (``read``: ``map_files``, the exact inode the process mapped, which needs
root; else ``root``, the path as the process's mount namespace sees it; else ``path``), ``"path":
null`` for a process with none mapped, ``"error"`` when the file could not be read, ``"deleted":
true`` when the mapped file has since been removed or replaced. With ``--pin`` the exit status is 1
when the pin is unreadable, no process matched, or any process mapped no libnccl or one whose
sha256 is not the pin's; else 0.
"""

import argparse
import ctypes
import hashlib
import json
import os
import re
import struct
import sys

NCCL_FILE = re.compile(r"libnccl\.so(\.[0-9]+)*$")
CHUNK = 1 << 20
SHORT = 12
PT_NOTE, SHT_NOTE, NT_GNU_BUILD_ID = 4, 7, 3
NOTE_LIMIT = 1 << 20  # a note segment larger than this is not read (no build-id note is)
DELETED = " (deleted)"


# ELF build-id ------------------------------------------------------------------------------------


def _notes(data, order, align):
    """(name, type, desc) of every note in ``data`` (a PT_NOTE segment or an SHT_NOTE section, which
    starts aligned): a 12-byte header, then the name and the desc, each starting at ``align``."""
    def up(n):
        return (n + align - 1) // align * align

    at = 0
    while at + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from(order + "III", data, at)
        name = data[at + 12:at + 12 + namesz].rstrip(b"\0")
        start = up(at + 12 + namesz)
        desc = data[start:start + descsz]
        if len(desc) < descsz:
            return
        yield name, kind, desc
        at = up(start + descsz)


def _build_id_in(data, order, aligns):
    for align in aligns:
        for name, kind, desc in _notes(data, order, align):
            if name == b"GNU" and kind == NT_GNU_BUILD_ID and desc:
                return desc.hex()
    return None


def build_id(path):
    """The ELF ``NT_GNU_BUILD_ID`` of ``path`` as lowercase hex, from its PT_NOTE segments, else its
    SHT_NOTE sections; None for a file that is not ELF or has no such note. Raises OSError."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            return None
        wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
        if wide:
            phoff, shoff = struct.unpack_from(order + "QQ", ident, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", ident, 0x36)
        else:
            phoff, shoff = struct.unpack_from(order + "II", ident, 0x1C)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", ident, 0x2A)
        size = os.fstat(f.fileno()).st_size

        def read(offset, length):
            if offset <= 0 or length <= 0 or length > NOTE_LIMIT or offset + length > size:
                return b""
            f.seek(offset)
            return f.read(length)

        for i in range(phnum if phentsize >= (56 if wide else 32) else 0):
            entry = read(phoff + i * phentsize, phentsize)
            if len(entry) < phentsize:
                break
            if wide:
                kind, _, offset, _, _, filesz, _, align = struct.unpack_from(order + "IIQQQQQQ", entry)
            else:
                kind, offset, _, _, filesz, _, _, align = struct.unpack_from(order + "IIIIIIII", entry)
            if kind == PT_NOTE:
                found = _build_id_in(read(offset, filesz), order, (8, 4) if align == 8 else (4,))
                if found:
                    return found
        for i in range(shnum if shentsize >= (64 if wide else 40) else 0):
            entry = read(shoff + i * shentsize, shentsize)
            if len(entry) < shentsize:
                break
            if wide:
                _, kind, _, _, offset, length, _, _, align, _ = struct.unpack_from(order + "IIQQQQIIQQ", entry)
            else:
                _, kind, _, _, offset, length, _, _, align, _ = struct.unpack_from(order + "IIIIIIIIII", entry)
            if kind == SHT_NOTE:
                found = _build_id_in(read(offset, length), order, (8, 4) if align == 8 else (4,))
                if found:
                    return found
    return None


# Bytes, version, identity --------------------------------------------------------------------------


def sha256(path):
    """The sha256 of the file at ``path`` (lowercase hex), read 1 MiB at a time. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def version_text(code):
    """``ncclGetVersion``'s code as ``2.30.7`` (NCCL 2.9 on: 23007; before: 2804 is 2.8.4)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nccl_version(path):
    """``ncclGetVersion`` of the library at ``path`` (or a soname) as ``2.30.7``; None when it does
    not load or has no such function. Loading runs the library's constructors."""
    try:
        lib = ctypes.CDLL(path)
        code = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version_text(code.value)


def _error(exc):
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


def identity(path, version=False):
    """``{"path", "sha256", "build_id"}`` of the file at ``path`` (``"version"`` too when asked: it
    loads the library), or ``{"path", "error"}`` when it cannot be read."""
    try:
        if not os.path.isfile(path):
            return {"path": path, "error": "no such file" if not os.path.exists(path) else "not a file"}
        found = {"path": path, "sha256": sha256(path), "build_id": build_id(path)}
    except OSError as exc:
        return {"path": path, "error": _error(exc)}
    if version:
        found["version"] = nccl_version(path)
    return found


def loaded_identity(library, proc_self="/proc/self"):
    """Load ``library`` (a soname: as the dynamic loader resolves it, ``LD_PRELOAD`` and what is
    already loaded included) and take the identity of the file it mapped (the one whose mapping
    holds ``ncclGetVersion``), with ``"version"``; ``{"path": library, "error"}`` when it does not
    load. A library loaded earlier by path with that soname is what a name gets: call this first."""
    try:
        lib = ctypes.CDLL(library)
        function = lib.ncclGetVersion
    except (OSError, AttributeError) as exc:
        return {"path": library, "error": f"not loadable ({exc})"}
    address = ctypes.cast(function, ctypes.c_void_p).value or 0
    code = ctypes.c_int()
    version = version_text(code.value) if function(ctypes.byref(code)) == 0 else None
    try:
        maps = _read(proc_self + "/maps")
    except OSError as exc:
        return {"path": library, "version": version, "error": f"{proc_self}/maps: {_error(exc)}"}
    for line in maps.splitlines():
        parts = line.split(None, 5)
        start, _, end = parts[0].partition("-")
        if len(parts) == 6 and int(start, 16) <= address < int(end, 16):
            path, deleted = parts[5], parts[5].endswith(DELETED)
            path = path[:-len(DELETED)] if deleted else path
            span = f"{int(start, 16):x}-{int(end, 16):x}"
            return dict(mapped_identity(proc_self, path, span, deleted=deleted), version=version)
    return {"path": library, "version": version, "error": "ncclGetVersion is in no mapped file"}


def short(value):
    """The first 12 hex of an id, ``none`` when there is none."""
    return value[:SHORT] if value else "none"


def build_text(found):
    """``build-id 1a2b3c4d5e6f, sha256 3c4d5e6f7a8b`` of an identity."""
    return "build-id {}, sha256 {}".format(short(found.get("build_id")), short(found.get("sha256")))


def same_build(a, b):
    """Whether two identities are one build: their sha256 are equal. A build-id is what a person is
    shown; equal build-ids with other bytes (a stripped or patched copy) are another build."""
    return bool(a.get("sha256")) and a.get("sha256") == b.get("sha256")


def describe_difference(found, pin):
    """What ``found`` is beside the pin, in one phrase, e.g. ``2.30.7 but another build (build-id
    1a2b3c4d5e6f, sha256 3c4d5e6f7a8b), the pin is build-id 9f8e7d6c5b4a sha256 7a6b5c4d3e2f``."""
    theirs = "build-id {} sha256 {}".format(short(pin.get("build_id")), short(pin.get("sha256")))
    if found.get("error"):
        return "unreadable ({})".format(found["error"])
    if same_build(found, pin):
        return f"the pin's build ({build_text(found)})"
    mine, pinned = build_text(found), pin.get("version")
    if "version" in found and found["version"] and pinned and found["version"] != pinned:
        return "{} ({}), the pin is {} {}".format(found["version"], mine, pinned, theirs)
    if found.get("version"):
        return "{} but another build ({}), the pin is {}".format(found["version"], mine, theirs)
    what = "not loadable" if "version" in found else "another build"
    return "{} ({}), the pin is {}{}".format(what, mine, pinned + " " if pinned else "", theirs)


# What running processes have mapped -------------------------------------------------------------


def _read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def mapped_nccl(maps_text):
    """``[(path, "start-end", deleted)]``: the first mapping of every distinct ``libnccl.so*`` file
    in a ``/proc/PID/maps`` text (range as ``map_files`` names it: hex without leading zeros)."""
    found, seen = [], set()
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path, deleted = parts[5], parts[5].endswith(DELETED)
        if deleted:
            path = path[:-len(DELETED)]
        if path in seen or not NCCL_FILE.search(os.path.basename(path)):
            continue
        seen.add(path)
        start, _, end = parts[0].partition("-")
        found.append((path, f"{int(start, 16):x}-{int(end, 16):x}", deleted))
    return found


def mapped_identity(proc_pid, path, span, cache=None, deleted=False):
    """The identity of the file a process mapped at ``span``: read through ``map_files`` (the exact
    inode), else through the process's root, else by its path (not for a deleted file: the path
    holds another file, or none); ``read`` says which."""
    errors, ways = [], [("map_files", f"{proc_pid}/map_files/{span}")]
    if not deleted:
        ways += [("root", f"{proc_pid}/root{path}"), ("path", path)]
    for how, candidate in ways:
        try:
            st = os.stat(candidate)
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if cache is not None and key in cache:
                return dict(cache[key], path=path, read=how)
            found = {"path": path, "sha256": sha256(candidate), "build_id": build_id(candidate), "read": how}
        except OSError as exc:
            errors.append(f"{how}: {_error(exc)}")
            continue
        if cache is not None:
            cache[key] = found
        return found
    return {"path": path, "error": "; ".join(errors)}


def live_mappings(match="vllm", proc="/proc"):
    """One entry per (process whose command line holds ``match``, case-insensitive; this one and
    its ancestors skipped) and distinct ``libnccl.so*`` file it has mapped; ``"path": None`` for a
    process with none (see the module's text for the keys)."""
    skip, pid = set(), os.getpid()
    while pid > 0 and pid not in skip:  # this script and what started it (a shell naming --match)
        skip.add(pid)
        try:
            pid = int(re.search(r"^PPid:\s*(\d+)", _read(f"{proc}/{pid}/status"), re.MULTILINE).group(1))
        except (OSError, AttributeError, ValueError):
            break
    entries, cache = [], {}
    for name in sorted((n for n in os.listdir(proc) if n.isdigit()), key=int):
        if int(name) in skip:
            continue
        base = f"{proc}/{name}"
        try:
            cmd = _read(base + "/cmdline", "rb").replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue  # gone, or a kernel thread's
        if not cmd or match.lower() not in cmd.lower():
            continue
        head = {"pid": int(name), "cmd": cmd[:120]}
        try:
            maps = mapped_nccl(_read(base + "/maps"))
        except OSError as exc:
            entries.append(dict(head, path=None, error=f"maps: {_error(exc)}"))
            continue
        if not maps:
            entries.append(dict(head, path=None))
        for path, span, deleted in maps:
            entry = dict(head, **mapped_identity(base, path, span, cache, deleted))
            if deleted:
                entry["deleted"] = True
            entries.append(entry)
    return entries


def live_ok(pin, processes):
    """Whether every process mapped a libnccl and only the pin's bytes (a readable pin, one process
    at least)."""
    if not pin or pin.get("error") or not processes:
        return False
    return all(p.get("path") and same_build(p, pin) for p in processes)


def main(argv):
    parser = argparse.ArgumentParser(prog="nccl_identity.py", description="identities of shared libraries")
    parser.add_argument("files", nargs="*")
    parser.add_argument("--version", action="store_true", help="add ncclGetVersion (loads each library)")
    parser.add_argument("--live", action="store_true", help="what running processes have mapped")
    parser.add_argument("--match", default="vllm", help="the processes whose command line holds this")
    parser.add_argument("--pin", help="with --live: exit 1 unless every process mapped this file's bytes")
    args = parser.parse_args(argv)
    if args.live:
        pin = identity(args.pin, version=args.version) if args.pin else None
        processes = live_mappings(args.match)
        print(json.dumps({"pin": pin, "processes": processes}, indent=1), flush=True)
        return 0 if not args.pin or live_ok(pin, processes) else 1
    if not args.files:
        parser.error("name a FILE, or --live")
    print(json.dumps([identity(path, version=args.version) for path in args.files], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
