"""
The head's image fan-out, ``sparkinfra/scripts/image_fanout.py`` with ``image_receive.sh`` in each
worker's session, run as ``transfer.image_fanout_command`` builds it. Stand-ins first on PATH do
what a test cannot: ``ssh`` runs the worker's command here (WORKER set to its IP), ``sudo`` runs
its command, and ``docker`` (a Python stand-in) is the head's (``image inspect``, ``save``) or a
worker's: its images' layers from the test's configuration, and a ``load`` that keeps what it was
sent and applies docker's rule (a layer's file is needed only when its chain ID is missing; a file
that is there must hold its diff ID).

Streams: a real ``docker save`` from Docker 20 (legacy ``<v1 id>/layer.tar`` folders), and
archives written here: Docker 25's OCI layout, tar header varieties (pax, GNU long names, ustar).
Also the parser's pieces on their own: ``v1_position``, ``members``, ``octal``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from test_stage import stubs

from sparkinfra import transfer
from sparkinfra.scripts import image_fanout as fanout_script

IMAGE = "fx:1"
SUDO = 'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n'  # sudo -n CMD: run CMD
FIXTURE = Path(__file__).parent / "fixtures/images/docker20-save-3-layers.tar"
FX_ID = "sha256:20b520d38ccea356e65a141a054a1a382341e6b6bb977b2c55d3514a9ae6759b"
FX_LAYERS = [
    "sha256:51e638dfcde724616d7c86f9cf73432c1e984f7fdef05e634e4abca36efab301",
    "sha256:34f400e78b8d112556f7d5fe1dd4b3de9101abcce4efcabc55034015ed365aef",
    "sha256:a4f545bc4787dc4127d2357be59f61f73ff5e21887231003e5b1ac6c15ce22e7",
]
BLOCK = 512
SIZE = r"\d+ [KM]iB"  # the script's sizes: KiB under one MiB, else MiB
SUMMARY = rf"image fx:1 to (?P<name>[\w-]+): (?P<sent>{SIZE}) in \d+ s, {SIZE}/s; (?P<layers>.+)"

# The docker stand-in: the head's when WORKER is unset, else that worker's. FANOUT_CONF names the
# image, the head's ID, layers, size and saved tar, and per worker IP its images (lists of diff
# IDs), whether it is a "liar" (its load ignores the layers it says it has) and how much of its
# stream its load reads before it fails ("dies_after", bytes; else it reads it all); FANOUT_SEEN is
# where it records each save and each stream a worker's load got (<ip>.<n>.tar).
DOCKER = r'''
import gzip, hashlib, io, json, os, sys, tarfile, time
from pathlib import Path

SEEN = Path(os.environ["FANOUT_SEEN"])
CONF = json.loads(Path(os.environ["FANOUT_CONF"]).read_text())


def chains(diffs):
    out = []
    for diff in diffs:
        out.append(diff if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return out


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def head(args):
    if args == ["image", "inspect", CONF["image"]]:
        print(json.dumps([{"Id": CONF["id"], "Size": CONF["size"],
                           "RootFS": {"Type": "layers", "Layers": CONF["layers"]}}]))
    elif args == ["save", CONF["image"]]:
        with open(SEEN / "saves", "a") as log:
            log.write("save\n")
        data = Path(CONF["tar"]).read_bytes()
        if CONF.get("save_dies_after") is not None:  # the head's daemon goes away mid-save (a reboot)
            sys.stdout.buffer.write(data[:CONF["save_dies_after"]])
            sys.stdout.buffer.flush()
            fail('error during connect: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.41/images/get": '
                 "read unix @->/run/docker.sock: read: connection reset by peer")
        bounds = [0, *CONF["cuts"], len(data)]
        for k, (start, end) in enumerate(zip(bounds, bounds[1:])):
            if k:
                time.sleep(CONF["pause"])
            sys.stdout.buffer.write(data[start:end])
            sys.stdout.buffer.flush()
    else:
        fail(f"head docker: unexpected {args}")


def worker(ip, args):
    me = CONF["workers"].get(ip, {})
    images = {"sha256:" + hashlib.sha256(json.dumps(layers).encode()).hexdigest(): layers
              for layers in me.get("images", [])}
    loaded = SEEN / f"{ip}.id"
    if args == ["image", "ls", "-aq", "--no-trunc"]:
        for image_id in images:
            print(image_id)
    elif args[:4] == ["image", "inspect", "--format", "{{json .RootFS.Layers}}"]:
        for image_id in args[4:]:
            print(json.dumps(images[image_id], separators=(",", ":")))
    elif args == ["load", "-q"]:
        data = sys.stdin.buffer.read(me.get("dies_after", -1))
        n = len(list(SEEN.glob(f"{ip}.*.tar")))
        (SEEN / f"{ip}.{n}.tar").write_bytes(data)
        if "dies_after" in me:
            fail("Error: write /var/lib/docker/tmp/docker-import-1: no space left on device")
        try:
            tar = tarfile.open(fileobj=io.BytesIO(data))
            files = set(tar.getnames())
            manifest = json.load(tar.extractfile("manifest.json"))[0]
            config = tar.extractfile(manifest["Config"]).read()
        except (tarfile.TarError, KeyError, ValueError) as error:
            fail(f"Error: invalid archive: {error}")
        has = set() if me.get("liar") else {c for layers in images.values() for c in chains(layers)}
        diffs = json.loads(config)["rootfs"]["diff_ids"]
        for path, diff, chain in zip(manifest["Layers"], diffs, chains(diffs)):
            if chain in has:
                continue
            if path not in files:
                fail(f"open /var/lib/docker/tmp/docker-import-1/{path}: no such file or directory")
            content = tar.extractfile(path).read()
            if content[:2] == b"\x1f\x8b":
                content = gzip.decompress(content)
            if "sha256:" + hashlib.sha256(content).hexdigest() != diff:
                fail(f"{path}: not the layer {diff}")
        loaded.write_text("sha256:" + hashlib.sha256(config).hexdigest())
        print(f"Loaded image: {CONF['image']}")
    elif args == ["image", "inspect", "--format", "{{.Id}}", CONF["image"]]:
        if not loaded.exists():
            fail(f"Error: No such image: {CONF['image']}")
        print(loaded.read_text())
    else:
        fail(f"worker docker: unexpected {args}")


if os.environ.get("WORKER"):
    worker(os.environ["WORKER"], sys.argv[1:])
else:
    head(sys.argv[1:])
'''


def prepare(tmp_path: Path, workers: list[tuple[str, str, list]], tar: Path = FIXTURE, layers=FX_LAYERS,
            image_id: str = FX_ID, liars=(), broken=(), dying: dict[str, int] | None = None, size: int = 0,
            cuts=(), pause: float = 0.0, every: str = "60", save_dies_after: int | None = None) -> tuple[str, dict, Path]:
    """The head's command, an environment with the stand-ins first on PATH, and where they record.

    + workers: ``(name, IP, images)``, each image a list of diff IDs the worker has
    + liars: IPs whose load ignores the layers they say they have
    + broken: IPs whose ssh fails (exit 255)
    + dying: IP -> bytes that worker's load reads before it fails
    + cuts: offsets where the head's save pauses ``pause`` seconds
    + save_dies_after: bytes the head's save writes before its daemon goes away (exit 1)
    """
    seen = tmp_path / "seen"
    seen.mkdir()
    dying = dying or {}
    conf = tmp_path / "docker.json"
    configured = {ip: {"images": images, "liar": ip in liars} for _, ip, images in workers}
    for ip, count in dying.items():
        configured[ip]["dies_after"] = count
    conf.write_text(json.dumps({"image": IMAGE, "id": image_id, "layers": layers, "size": size, "tar": str(tar),
                                "cuts": list(cuts), "pause": pause, "workers": configured,
                                "save_dies_after": save_dies_after}))
    stub = tmp_path / "docker_stub.py"
    stub.write_text(DOCKER)
    env = stubs(
        tmp_path,
        sudo=SUDO,
        docker=f'exec {shlex.quote(sys.executable)} {shlex.quote(str(stub))} "$@"\n',
        ssh=(
            'while [ "$1" = -o ]; do shift 2; done\n'
            "ip=$1; shift\n"
            f'echo "$ip" >> {shlex.quote(str(seen))}/sessions\n'
            f"case ' {' '.join(broken)} ' in *\" $ip \"*)\n"
            '  echo "ssh: connect to host $ip port 22: Connection refused" >&2; exit 255;;\n'
            "esac\n"
            'WORKER=$ip exec sh -c "$*"\n'
        ),
    )
    env.update(FANOUT_SEEN=str(seen), FANOUT_CONF=str(conf), PROGRESS_EVERY=every)
    command = transfer.image_fanout_command(IMAGE, image_id, [(name, ip) for name, ip, _ in workers]).get_raw_value()
    return command, env, seen


def start(command: str, env: dict) -> subprocess.Popen:
    """The head's command, in a process group of its own (so a hung run can be ended whole)."""
    return subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def end(proc: subprocess.Popen) -> None:
    """Ends a run that hung, with every process it started (they hold its output open)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def fanout(tmp_path: Path, workers, timeout: float = 60, **kw) -> tuple[subprocess.CompletedProcess, Path]:
    command, env, seen = prepare(tmp_path, workers, **kw)
    proc = start(command, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end(proc)
        out, err = proc.communicate()
        raise AssertionError(f"the fan-out still ran after {timeout} s; stderr: {err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def streams(seen: Path, ip: str) -> list[bytes]:
    """What each of the worker's loads received, in order."""
    found = sorted(seen.glob(f"{ip}.*.tar"), key=lambda p: int(p.name.split(".")[-2]))
    return [p.read_bytes() for p in found]


def contents(data: bytes) -> dict[str, bytes | None]:
    """A tar's members, in order, each name to its content (None for what is not a file)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() if m.isfile() else None for m in tar.getmembers()}


def amount(n: int) -> str:
    """A size as the script writes it: in KiB under one MiB, else in MiB (rounded down)."""
    return f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB"


def in_bytes(text: str) -> int:
    number, unit = text.split()
    return int(number) << (10 if unit == "KiB" else 20)


def summaries(stdout: str) -> dict[str, tuple[str, str]]:
    """Each worker's summary line: name -> (what it was sent, what it says of the layers)."""
    found = {}
    for line in stdout.splitlines():
        matched = re.fullmatch(SUMMARY, line)
        assert matched, line
        found[matched["name"]] = matched["sent"], matched["layers"]
    return found


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FX = contents(FIXTURE.read_bytes())
FX_MANIFEST = json.loads(FX["manifest.json"])[0]
FX_FILES = FX_MANIFEST["Layers"]  # <v1 id>/layer.tar of each layer, in order


# Archives written here: entries of a tar, each in its own header format
# ------------------------------------------------------------------------


@dataclass
class Entry:
    """A tar entry: its headers as ``tarfile`` writes them in ``fmt``, but for the fields given in
    ``own`` (name, prefix, size), written instead in its own (last) header."""

    info: tarfile.TarInfo
    data: bytes
    fmt: int
    own: dict = field(default_factory=dict)

    def tobytes(self) -> bytes:
        headers = self.info.tobuf(self.fmt, "utf-8", "surrogateescape")
        if self.own:
            headers = headers[:-BLOCK] + rewritten(headers[-BLOCK:], **self.own)
        return headers + self.data + bytes(-len(self.data) % BLOCK)


def rewritten(header: bytes, name: str | None = None, prefix: str | None = None, size: int | None = None) -> bytes:
    """A ustar header with other name, prefix or size fields, its checksum made again."""
    block = bytearray(header)
    if name is not None:
        block[0:100] = name.encode().ljust(100, b"\0")
    if prefix is not None:
        block[345:500] = prefix.encode().ljust(155, b"\0")
    if size is not None:
        block[124:136] = b"%011o\0" % size
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % sum(block)
    return bytes(block)


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, fmt: int = tarfile.PAX_FORMAT,
          **attrs) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.mode = kind, 0, 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return Entry(info, data, fmt)


def archive(entries: list[Entry], pax_global: dict | None = None) -> bytes:
    """The tar of these entries, after a pax global header if given, ended as ``tarfile`` ends one."""
    out = tarfile.TarInfo.create_pax_global_header(pax_global) if pax_global else b""
    out += b"".join(e.tobytes() for e in entries) + bytes(2 * BLOCK)
    return out + bytes(-len(out) % tarfile.RECORDSIZE)


def layer(name: str, payload: bytes) -> bytes:
    """A layer's tar: one file."""
    return archive([entry(name, payload)])


def oci_entries(blobs: list[bytes], uses: list[int] | None = None,
                gzipped: bool = False) -> tuple[list[Entry], list[str], str]:
    """What Docker 25 on saves of IMAGE with these layer tars: its entries (the layers' from the
    third on, each once), diff IDs and image ID.

    + uses: which blob each layer of the image is, bottom up (default: each once, in order)
    + gzipped: the blobs compressed, named by that digest (as containerd's image store keeps them)
    """
    uses = list(range(len(blobs))) if uses is None else uses
    files = [gzip.compress(b, mtime=0) if gzipped else b for b in blobs]
    diffs = ["sha256:" + sha(blobs[i]) for i in uses]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    oci_manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + sha(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzipped else ""),
                    "digest": "sha256:" + sha(files[i]), "size": len(files[i])} for i in uses],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + sha(oci_manifest),
        "size": len(oci_manifest), "annotations": {"io.containerd.image.name": "docker.io/library/fx:1"}}]}).encode()
    manifest = json.dumps([{"Config": f"blobs/sha256/{sha(config)}", "RepoTags": [IMAGE],
                            "Layers": [f"blobs/sha256/{sha(files[i])}" for i in uses]}]).encode()
    entries = [entry("blobs", kind=tarfile.DIRTYPE), entry("blobs/sha256", kind=tarfile.DIRTYPE)]
    entries += [entry(f"blobs/sha256/{sha(f)}", f) for f in files]
    entries += [entry(f"blobs/sha256/{sha(config)}", config), entry(f"blobs/sha256/{sha(oci_manifest)}", oci_manifest),
                entry("index.json", index), entry("manifest.json", manifest),
                entry("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')]
    return entries, diffs, "sha256:" + sha(config)


# Docker 20's save (legacy layer folders)
# ----------------------------------------


def test_each_worker_gets_only_the_legacy_layer_files_it_lacks_from_one_save(tmp_path):
    """A has nothing, B the first two layers, C all three (another image): one save; each load
    gets every entry but the layer.tar of the layers it has, and each summary counts them."""
    a, b, c = "10.213.1.2", "10.213.1.3", "10.213.1.4"
    workers = [("spark-2", a, []), ("spark-3", b, [FX_LAYERS[:2]]), ("spark-4", c, [FX_LAYERS])]
    proc, seen = fanout(tmp_path, workers)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert (seen / "saves").read_text() == "save\n"
    assert FX_FILES == [name for name in FX if name.endswith("/layer.tar")]  # the fixture is as described
    expected = {a: list(FX), b: [n for n in FX if n not in FX_FILES[:2]], c: [n for n in FX if n not in FX_FILES]}
    sent = {}
    for ip, names in expected.items():
        [got] = streams(seen, ip)
        received = contents(got)
        assert list(received) == names, ip
        assert all(received[n] == FX[n] for n in names), ip
        assert (seen / f"{ip}.id").read_text() == FX_ID, ip
        sent[ip] = amount(len(got))
    layer_size = len(FX[FX_FILES[0]])
    assert summaries(proc.stdout) == {
        "spark-2": (sent[a], "all 3 layers"),
        "spark-3": (sent[b], f"1 of 3 layers (it has the other 2, {amount(2 * layer_size)})"),
        "spark-4": (sent[c], f"0 of 3 layers (it has the other 3, {amount(3 * layer_size)})"),
    }
    assert list(summaries(proc.stdout)) == ["spark-2", "spark-3", "spark-4"]  # in the order given


def test_v1_position_tells_each_legacy_folder_by_its_json():
    """Docker's v1 ID recomputed from a folder's json gives its layer; a json that differs in a
    byte, or chains of another image, give none."""
    chains = fanout_script.chain_ids(FX_LAYERS)
    for position, layer_file in enumerate(FX_FILES):
        folder = layer_file.rpartition("/")[0]
        raw = FX[f"{folder}/json"]
        assert fanout_script.v1_position(raw, chains) == position, folder
        created = re.search(rb'"created":"[^"]*"', raw)[0]
        assert fanout_script.v1_position(raw.replace(created, b'"created":"1999-01-01T00:00:00Z"'), chains) is None
        assert fanout_script.v1_position(raw, fanout_script.chain_ids(FX_LAYERS[::-1])) is None
        assert fanout_script.v1_position(raw, fanout_script.chain_ids(["sha256:" + "0" * 64] + FX_LAYERS)) is None
    assert fanout_script.v1_position(b'{"created":"1970-01-01T00:00:00Z"}', chains) is None  # no id
    assert fanout_script.v1_position(b"not json", chains) is None


def test_members_gives_each_value_as_its_exact_bytes():
    """Escaped quotes and backslashes, brackets inside strings, nested values, numbers, true, null
    and whitespace around separators: each value exactly as written, less trailing whitespace."""
    raw = (b'{ "s" : "a \\"quoted\\" \\\\ back\\\\" ,"n":{"k":[1, {"z":"}]"}], "q" : "[" } ,\n'
           b'"num": -1.5e+3 ,"t":true,"z":null , "empty" : [ ] ,"k\\"ey":"v",  "last" :  7 \n}')
    assert fanout_script.members(raw) == [
        ("s", b'"a \\"quoted\\" \\\\ back\\\\"'),
        ("n", b'{"k":[1, {"z":"}]"}], "q" : "[" }'),
        ("num", b"-1.5e+3"),
        ("t", b"true"),
        ("z", b"null"),
        ("empty", b"[ ]"),
        ('k"ey', b'"v"'),
        ("last", b"7"),
    ]
    assert fanout_script.members(b"{}") == []
    assert dict(fanout_script.members(FX[FX_FILES[0].rpartition("/")[0] + "/json"]))["os"] == b'"linux"'


# Docker 25's save (OCI layout)
# ------------------------------


def test_oci_layer_blobs_go_only_to_the_workers_that_lack_their_chain(tmp_path):
    """The worker with the first layer gets every blob but its; one with only the second layer (at
    another place in its chain) and one with nothing get all."""
    blobs = [layer("etc/one", b"one\n" * 100), layer("etc/two", b"two\n" * 100)]
    entries, diffs, image_id = oci_entries(blobs)
    tar = tmp_path / "oci.tar"
    tar.write_bytes(archive(entries))
    full = list(contents(tar.read_bytes()))
    a, b, c = "10.213.1.2", "10.213.1.3", "10.213.1.4"
    workers = [("spark-2", a, [diffs[:1]]), ("spark-3", b, [diffs[1:]]), ("spark-4", c, [])]
    proc, seen = fanout(tmp_path, workers, tar=tar, layers=diffs, image_id=image_id)
    assert proc.returncode == 0, proc.stderr
    first = f"blobs/sha256/{diffs[0][7:]}"
    assert list(contents(streams(seen, a)[0])) == [n for n in full if n != first]
    for ip in (b, c):
        assert streams(seen, ip) == [tar.read_bytes()], ip
    assert all((seen / f"{ip}.id").read_text() == image_id for ip in (a, b, c))
    whole = amount(len(tar.read_bytes()))
    assert summaries(proc.stdout) == {
        "spark-2": (amount(len(streams(seen, a)[0])), f"1 of 2 layers (it has the other 1, {amount(len(blobs[0]))})"),
        "spark-3": (whole, "all 2 layers"),
        "spark-4": (whole, "all 2 layers"),
    }


def test_a_blob_the_image_uses_twice_goes_to_a_worker_that_lacks_either_use(tmp_path):
    """Layers [L, E, M, E] (E saved once): a worker with [L, E] lacks the second E's chain, so it
    gets E's blob and M's in the one stream, not L's."""
    blobs = [layer("l", b"l\n"), layer("e", b""), layer("m", b"m\n")]
    entries, diffs, image_id = oci_entries(blobs, uses=[0, 1, 2, 1])
    tar = tmp_path / "oci.tar"
    tar.write_bytes(archive(entries))
    a = "10.213.1.2"
    proc, seen = fanout(tmp_path, [("spark-2", a, [diffs[:2]])], tar=tar, layers=diffs, image_id=image_id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no second save
    [got] = streams(seen, a)
    assert list(contents(got)) == [e.info.name for e in entries if e.info.name != f"blobs/sha256/{diffs[0][7:]}"]
    assert summaries(proc.stdout) == {
        "spark-2": (amount(len(got)), f"3 of 4 layers (it has the other 1, {amount(len(blobs[0]))})")}


def test_layers_named_by_their_compressed_digest_go_whole(tmp_path):
    """Blobs named by the digest of their gzip (containerd's image store) are not told apart: a
    worker with every layer still gets the very bytes saved, and its summary says all of them."""
    blobs = [layer("etc/one", b"one\n" * 100), layer("etc/two", b"two\n" * 100)]
    entries, diffs, image_id = oci_entries(blobs, gzipped=True)
    tar = tmp_path / "oci.tar"
    tar.write_bytes(archive(entries))
    a = "10.213.1.2"
    proc, seen = fanout(tmp_path, [("spark-2", a, [diffs])], tar=tar, layers=diffs, image_id=image_id)
    assert proc.returncode == 0, proc.stderr
    assert streams(seen, a) == [tar.read_bytes()]
    assert summaries(proc.stdout) == {"spark-2": (amount(len(tar.read_bytes())), "all 2 layers")}


# When a worker fails
# --------------------


def test_a_worker_whose_partial_load_fails_gets_all_of_the_image_from_a_second_save(tmp_path):
    """B says it has the first two layers but its load needs every file: its first load fails,
    which is said with docker's reason, and a second save sends it all; A gets one stream."""
    a, b = "10.213.1.2", "10.213.1.3"
    workers = [("spark-2", a, []), ("spark-3", b, [FX_LAYERS[:2]])]
    proc, seen = fanout(tmp_path, workers, liars=(b,))
    assert proc.returncode == 0, proc.stderr
    reason = f"open /var/lib/docker/tmp/docker-import-1/{FX_FILES[0]}: no such file or directory"
    assert proc.stderr.splitlines() == [
        f"spark-3: its load of the layers it lacked failed ({reason}); sending all of fx:1"]
    assert (seen / "saves").read_text() == "save\nsave\n"
    first, second = streams(seen, b)
    assert list(contents(first)) == [n for n in FX if n not in FX_FILES[:2]]
    assert second == FIXTURE.read_bytes()
    assert streams(seen, a) == [FIXTURE.read_bytes()]
    assert all((seen / f"{ip}.id").read_text() == FX_ID for ip in (a, b))
    whole = amount(len(FIXTURE.read_bytes()))
    assert summaries(proc.stdout) == {"spark-2": (whole, "all 3 layers"), "spark-3": (whole, "all 3 layers")}


def test_a_save_the_heads_docker_cuts_is_named_as_the_heads_and_not_retried(tmp_path):
    """Issue 42: the head's docker goes away mid-save (the head rebooting): the run says the stream
    was cut on the head, each worker's line says so instead of its load's error, no second save."""
    a, b = "10.213.1.2", "10.213.1.3"
    proc, seen = fanout(tmp_path, [("spark-2", a, []), ("spark-3", b, [FX_LAYERS[:1]])], save_dies_after=3000)
    assert proc.returncode == 1
    err = proc.stderr
    assert "connection reset by peer" in err
    assert "image fx:1: the head's docker save failed (exit 1, its error above): the stream was cut on the head" in err
    assert f"spark-2: fx:1 is missing, the head has {FX_ID} (the head's save failed)" in err
    assert f"spark-3: fx:1 is missing, the head has {FX_ID} (the head's save failed)" in err
    assert "its load of the layers it lacked failed" not in err  # nothing to retry: the head is the cause
    assert (seen / "saves").read_text() == "save\n"
    assert all(re.fullmatch(rf"image fx:1 to spark-[23]: cut after {SIZE} in \d+ s, {SIZE}/s; .+", line)
               for line in proc.stdout.splitlines()), proc.stdout


def test_a_worker_whose_ssh_fails_does_not_stop_the_others_and_is_named(tmp_path):
    """spark-3's ssh fails (255): the others load from the one save, and it is named last with
    ssh's reason, the head's full ID, and exit 1."""
    ips = ["10.213.1.2", "10.213.1.3", "10.213.1.4"]
    workers = [("spark-2", ips[0], []), ("spark-3", ips[1], []), ("spark-4", ips[2], [FX_LAYERS[:1]])]
    proc, seen = fanout(tmp_path, workers, broken=(ips[1],))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"spark-3: fx:1 is missing, the head has {FX_ID} (ssh: connect to host {ips[1]} port 22: Connection refused)")
    assert "its load" not in proc.stderr  # nothing was left out for it: no second try
    assert (seen / "saves").read_text() == "save\n"
    assert sorted((seen / "sessions").read_text().split()) == ips  # one session each, no other
    assert streams(seen, ips[1]) == []
    assert streams(seen, ips[0]) == [FIXTURE.read_bytes()]
    assert list(contents(streams(seen, ips[2])[0])) == [n for n in FX if n != FX_FILES[0]]
    assert all((seen / f"{ip}.id").read_text() == FX_ID for ip in (ips[0], ips[2]))


def test_a_load_that_ends_while_a_layer_goes_to_it_alone_does_not_cut_the_others_stream(tmp_path):
    """A one-layer image, the layer (1.5 MiB) wanted by B only (A has it): B's load fails after
    64 KiB; A's stream is still whole less the layer, and B is named with docker's reason."""
    blobs = [layer("big", os.urandom(3 << 19))]
    entries, diffs, image_id = oci_entries(blobs)
    tar = tmp_path / "oci.tar"
    tar.write_bytes(archive(entries))
    a, b = "10.213.1.2", "10.213.1.3"
    proc, seen = fanout(tmp_path, [("spark-2", a, [diffs]), ("spark-3", b, [])], tar=tar, layers=diffs,
                        image_id=image_id, dying={b: 64 << 10})
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"spark-3: fx:1 is missing, the head has {image_id} "
                                        "(Error: write /var/lib/docker/tmp/docker-import-1: no space left on device)"]
    assert (seen / "saves").read_text() == "save\n"  # it had no layer left out: nothing to send again
    [got] = streams(seen, a)
    expected = archive([e for e in entries if e is not entries[2]])
    assert got.rstrip(b"\0") == expected.rstrip(b"\0") and got.endswith(bytes(2 * BLOCK))
    assert (seen / f"{a}.id").read_text() == image_id
    found = summaries(proc.stdout)
    assert found["spark-2"] == (amount(len(got)), f"0 of 1 layers (it has the other 1, {amount(len(blobs[0]))})")
    assert found["spark-3"][1] == "its one layer"


# Progress
# ---------

PROGRESS = (rf"image fx:1: (?P<read>\d+) of about 7 MiB read, \d+ MiB/s(?:, ETA \d+ s)?"
            rf"; sent spark-2 (?P<a>{SIZE}), spark-3 (?P<b>{SIZE})")


def test_progress_once_a_period_then_a_summary_per_worker(tmp_path):
    """About 6 MiB saved in three parts 1.3 s apart, each cut inside a layer, PROGRESS_EVERY=1: a
    line a second at most, what was read and sent (a layer as it comes) never going back; then
    each worker's total and the layers it had."""
    blobs = [layer(f"data/{i}", os.urandom(2 << 20)) for i in range(3)]
    entries, diffs, image_id = oci_entries(blobs)
    tar = tmp_path / "oci.tar"
    tar.write_bytes(archive(entries))
    with tarfile.open(tar) as saved:  # 1.5 MiB into the first layer's body, then into the second's
        cuts = [saved.getmember(e.info.name).offset_data + (3 << 19) for e in entries[2:4]]
    workers = [("spark-2", "10.213.1.2", []), ("spark-3", "10.213.1.3", [diffs[:1]])]
    command, env, seen = prepare(tmp_path, workers, tar=tar, layers=diffs, image_id=image_id, size=7 << 20,
                                 cuts=cuts, pause=1.3, every="1")
    began = time.monotonic()
    proc = start(command, env)
    timer = threading.Timer(30, end, [proc])
    timer.start()
    try:
        lines = [(time.monotonic() - began, line.rstrip("\n")) for line in proc.stdout]
        assert proc.wait() == 0, (lines, proc.stderr.read())
    finally:
        timer.cancel()
    took = time.monotonic() - began
    progress, done = lines[:-2], [line for _, line in lines[-2:]]
    assert progress and all(re.fullmatch(PROGRESS, line) for _, line in progress), lines
    assert len(progress) <= took + 1 and all(t2 - t1 > 0.5 for (t1, _), (t2, _) in zip(progress, progress[1:])), lines
    counts = []
    for _, line in progress:
        matched = re.fullmatch(PROGRESS, line)
        counts.append((int(matched["read"]) << 20, in_bytes(matched["a"]), in_bytes(matched["b"])))
    for column in zip(*counts):
        assert list(column) == sorted(column), lines
    [to_a], [to_b] = streams(seen, "10.213.1.2"), streams(seen, "10.213.1.3")
    assert to_a == tar.read_bytes()  # the first layer, spliced to spark-2 alone, byte for byte
    assert all(b < a <= len(to_a) and r <= len(to_a) for r, a, b in counts), lines  # spark-3 has the first layer
    assert counts[0][0] >= 1 << 20 and counts[0][1] >= 1 << 20, lines  # a layer is sent as it is read
    assert amount(len(to_a)) == "6 MiB" and amount(len(to_b)) == "4 MiB"
    assert summaries("\n".join(done)) == {
        "spark-2": ("6 MiB", "all 3 layers"),
        "spark-3": ("4 MiB", f"2 of 3 layers (it has the other 1, {amount(len(blobs[0]))})"),
    }


# Tar headers the parser passes through
# --------------------------------------


def test_pax_gnu_and_ustar_headers_pass_through_and_go_with_the_entry_they_describe(tmp_path):
    """Layers named by a pax path (not their ustar name field) or a ustar prefix, or sized by a pax
    record (as Go writes a layer over 8 GiB), among a pax global header, pax and GNU long names, a
    link, a GNU long link name: a worker with nothing gets the very bytes saved; one with layers gets the same less those
    layers' entries, their own headers with them."""
    blobs = [layer("etc/one", b"one\n"), layer("etc/two", b"two\n"), layer("big", os.urandom(3 << 19))]
    entries, diffs, image_id = oci_entries(blobs)
    first, second, big = entries[2:5]
    first.info.pax_headers = {"path": first.info.name, "comment": "the first layer"}
    first.own = {"name": "not/the/path"}
    second.fmt, second.own = tarfile.USTAR_FORMAT, {"prefix": "blobs/sha256", "name": diffs[1][7:]}
    big.info.pax_headers, big.own = {"size": str(len(blobs[2]))}, {"size": 0}
    entries += [
        entry("extra/" + "p" * 120 + "/pax-long-name.txt", b"pax\n"),
        entry("extra/caf\u00e9.txt", b"utf-8 name\n"),
        entry("extra/" + "g" * 150 + "/gnu-long-name.txt", b"gnu\n", fmt=tarfile.GNU_FORMAT),
        entry("extra/" + "u" * 120 + "/ustar.txt", b"ustar prefix\n", fmt=tarfile.USTAR_FORMAT),
        entry("extra/link", kind=tarfile.SYMTYPE, linkname="../oci-layout"),
        # a GNU long link name: a "K" header with data, then the link's own header
        entry("extra/long-link", kind=tarfile.SYMTYPE, linkname="../" + "k" * 150, fmt=tarfile.GNU_FORMAT),
    ]
    saved = archive(entries, pax_global={"comment": "a global header"})
    with tarfile.open(fileobj=io.BytesIO(saved)) as check:  # what the archive is said to hold, it holds
        assert check.getnames() == [e.info.name for e in entries]
        assert check.getmember(big.info.name).size == len(blobs[2]) and b"././@LongLink" in saved
        assert saved[156:157] == tarfile.XGLTYPE
    tar = tmp_path / "tar-kinds.tar"
    tar.write_bytes(saved)
    a, b, c = "10.213.1.2", "10.213.1.3", "10.213.1.4"
    workers = [("spark-2", a, []), ("spark-3", b, [diffs[:2]]), ("spark-4", c, [diffs])]
    proc, seen = fanout(tmp_path, workers, tar=tar, layers=diffs, image_id=image_id)
    assert proc.returncode == 0, proc.stderr
    assert streams(seen, a) == [saved]
    for ip, left_out in ((b, (first, second)), (c, (first, second, big))):
        expected = archive([e for e in entries if e not in left_out], pax_global={"comment": "a global header"})
        [got] = streams(seen, ip)
        assert got.rstrip(b"\0") == expected.rstrip(b"\0"), ip  # the same up to the zero blocks that end it
        assert len(got) % BLOCK == 0 and got.endswith(bytes(2 * BLOCK)), ip
    assert summaries(proc.stdout) == {
        "spark-2": (amount(len(saved)), "all 3 layers"),
        "spark-3": (amount(len(streams(seen, b)[0])),
                    f"1 of 3 layers (it has the other 2, {amount(sum(map(len, blobs[:2])))})"),
        "spark-4": (amount(len(streams(seen, c)[0])),
                    f"0 of 3 layers (it has the other 3, {amount(sum(map(len, blobs)))})"),
    }


def test_octal_reads_octal_and_base_256_size_fields():
    """A size field in base-256 (first byte 0x80, as GNU writes over 8 GiB), or octal however padded."""
    size = 9 << 30  # over 8 GiB: GNU base-256
    field = tarfile.itn(size, 12, tarfile.GNU_FORMAT)
    assert field[0] == 0x80 and fanout_script.octal(field) == size
    assert fanout_script.octal(tarfile.itn(1000, 12, tarfile.USTAR_FORMAT)) == 1000
    assert fanout_script.octal(b"00000001750\0") == 1000
    assert fanout_script.octal(b"   1750 \0\0\0\0") == 1000
    assert fanout_script.octal(bytes(12)) == 0
