"""
Staging speed on the bed, head -> worker over the simulated fabric, measured in one run.

    python benchmarks/staging.py            # as root; the bed's pair as it is, else brought up and down
    python benchmarks/staging.py --quick    # 2 x 64 MiB + 40 small files, one round of each

Prints, for a synthetic snapshot (>= 2 GiB: a few large shards, many small files, random content),
three rounds in rotated order (the machine's speed drifts; one lucky or unlucky run decides nothing)
of: the raw pipe ceiling (TCP, no protocol, into a file on the worker's disk: the path any copy of
the snapshot must take), the seeds' method (``rsync -a`` over ssh, default cipher) and the tool's
staging step (what ``deploys/stage.py`` runs: the head's daemon started as the worker's pull starts,
in one operation, then the daemon stopped, each on an SSH connection opened before, as pyinfra
holds one to every host for the whole run), each with the bytes the worker's fabric port received;
the raw pipe into /dev/null; the step's fixed cost (a transfer with nothing to move);
and the no-op restage (the worker's check, a whole
``pyinfra … deploys/stage.py`` run, and pyinfra's floor: a run that only connects and reads one
fact; best of 3 each). Then the image: ``docker save | ssh | docker load`` against the tool's
fan-out, three rounds alternated, with the bytes moved; the ID check when the IDs already match; and
an update of an image whose top layer changed (the bytes the tool moves against that layer's size). Last
line: ``staging/ceiling = R (each round: ...)``, R the worst round. All nodes share this machine's
cores: compare the figures with each other, not with a real 200G link. A lane serving on the bed
is torn down first (``deploys/teardown.py``: its container holds the image's layers on the worker,
and the image rounds start from a worker without images); ``deploys/serve.py`` serves it again.
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks.harness import bed_of, containers_run, options  # noqa: E402
from sparkinfra import transfer  # noqa: E402
from sparkinfra.facts.stage import snapshot_tool_command  # noqa: E402
from sparkinfra.remote import settings_of  # noqa: E402

HEAD, WORKER = "spark-1", "spark-2"
REPO, REV = "sparkbed/bench-moe", "bec4" + "0" * 35 + "1"  # a commit (hex): staged as pinned, nothing to lock
CACHE = "/var/lib/sparkinfra/hf"
REPO_DIR = transfer.repo_dir(CACHE, REPO)
# 2 GiB: a copy the worker's page cache takes whole (this machine's disk writes back at its own
# varying pace: past ~2.3 GiB dirty, a method that keeps its copy would measure the disk).
LARGE, LARGE_BYTES, SMALL, SMALL_BYTES = 4, 512 << 20, 400, 64 << 10
QUICK = 2, 64 << 20, 40, 64 << 10  # --quick: every step, no figure to quote
ROUNDS = 3
TOP_LAYER = 32 << 20  # the image update's one new layer
# The ceiling's receiver: socket to file with the least work per byte (one buffer, unbuffered writes).
CEILING_RECEIVER = (
    "import os\nfd = os.open('/var/tmp/ceiling', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "buf = bytearray(4 << 20)\nview = memoryview(buf)\nwhile (n := c.recv_into(buf)):\n    os.write(fd, view[:n])"
)
# The seeds' ssh: OpenSSH's defaults, not the mesh's faster choices (sparkinfra.operations.mesh).
SEEDS_SSH = "ssh -o Ciphers=chacha20-poly1305@openssh.com -o KexAlgorithms=sntrup761x25519-sha512@openssh.com"


def sh(node: str, command: str) -> subprocess.CompletedProcess:
    return bed.node_exec(node, "bash", "-c", command)


def timed(node: str, command: str) -> float:
    started = time.monotonic()
    sh(node, command)
    return time.monotonic() - started


def fresh_start() -> None:
    """Each method starts alike: no copy on the worker (nor one still writing back), the head's
    snapshot in its page cache (this machine pages out what stays unread for a few seconds: the
    method after a slow one would read from disk)."""
    sh(WORKER, f"rm -rf {REPO_DIR} /home/spark2/seeds; sync")
    warm_head()


def warm_head() -> None:
    sh(HEAD, f"cat {REPO_DIR}/blobs/* > /dev/null")


def rate(seconds: float, size: int) -> str:
    return f"{size / seconds / 1e6:8.0f} MB/s  ({seconds:6.2f} s)"


def received(node: str) -> int:
    """Bytes ``node`` has received on its fabric port (what a transfer to it moved)."""
    return int(sh(node, "cat /sys/class/net/enp1s0f0np0/statistics/rx_bytes").stdout)


def moved(node: str, run) -> tuple[float, int]:
    """(seconds, bytes ``node`` received) of ``run()``, which returns its seconds."""
    before = received(node)
    seconds = run()
    return seconds, received(node) - before


def spread(values: list[float]) -> str:
    return f"min {min(values):.2f} / median {statistics.median(values):.2f} / max {max(values):.2f} s"


def connect(node: bed.SimNode, control: Path) -> list[str]:
    """Open an SSH connection from the controller (the management namespace) to ``node``, as pyinfra
    holds one to every host for its whole run; returns the command line that runs a command as
    root on it (a new session on that connection, through sudo, as pyinfra's operations run)."""
    ssh = ["ip", "netns", "exec", bed.MGMT_NS, "ssh", "-i", str(bed.controller_key()), "-o", "BatchMode=yes",
           "-o", f"UserKnownHostsFile={bed.known_hosts()}", "-S", str(control / node.name), f"{node.user}@{node.mgmt_ip}"]
    # ControlPersist: at most the benchmark's length, should it die before disconnect().
    subprocess.run([*ssh, "-o", "ControlMaster=yes", "-o", "ControlPersist=900", "true"], check=True,
                   stdin=subprocess.DEVNULL)
    return [*ssh, "sudo", "-n", "sh", "-c"]


def disconnect(control: Path) -> None:
    """Close every connection ``connect`` opened with sockets in ``control``."""
    for socket in control.iterdir():
        subprocess.run(["ip", "netns", "exec", bed.MGMT_NS, "ssh", "-S", str(socket), "-O", "exit", "x"],
                       capture_output=True)


def on(connection: list[str], command: str) -> None:
    subprocess.run([*connection, shlex.quote(command)], check=True, capture_output=True, stdin=subprocess.DEVNULL)


def pyinfra(*args: str) -> float:
    """Seconds one ``pyinfra -y ARGS`` took (``harness.pyinfra``: it must succeed)."""
    started = time.monotonic()
    harness.pyinfra(*args)
    return time.monotonic() - started


def raw_pipe(worker_ip: str, receive: str) -> float:
    """Seconds to send the snapshot's blobs from the head to a Python listener on the worker that
    runs ``receive`` on each connection ``c``."""
    listen = (
        "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('{worker_ip}', 9931)); s.listen(1); c,_=s.accept()\n{receive}"
    )
    receiver = subprocess.Popen(["nsenter", "-t", str(bed.container_pid(WORKER)), "-m", "-n", "-p", "--",
                                 "python3", "-c", listen])
    time.sleep(0.5)
    seconds = timed(HEAD, f"cat {REPO_DIR}/blobs/* > /dev/tcp/{worker_ip}/9931")
    receiver.wait(timeout=30)
    return seconds


def main() -> int:
    quick = options(__doc__).quick
    control = Path(tempfile.mkdtemp(prefix="staging-bench-"))  # the SSH connections' sockets
    try:
        with bed_of(2):
            return benchmark(control, quick)
    finally:
        disconnect(control)
        shutil.rmtree(control, ignore_errors=True)


def benchmark(control: Path, quick: bool) -> int:
    rounds, best_of = (1, 1) if quick else (ROUNDS, 3)
    large, large_bytes, small, small_bytes = QUICK if quick else (LARGE, LARGE_BYTES, SMALL, SMALL_BYTES)
    if containers_run(WORKER):
        print("a lane serves on the bed: torn down first (its container holds the image's layers on the worker)")
        pyinfra("inventory/sim.py", "deploys/teardown.py")
    data = ["--data", f"model={REPO}", "--data", f"model_revision={REV}", "--data", "lane="]
    pyinfra("inventory/sim.py", "deploys/prepare.py")
    bed.make_snapshot(bed.node_dir(HEAD) / f"root{CACHE}", REPO, REV, large=large, large_bytes=large_bytes,
                      small=small, small_bytes=small_bytes, seed=1)
    size = int(sh(HEAD, f"du -sbL {REPO_DIR}/blobs | cut -f1").stdout.split()[0])
    head_ip, worker_ip = bed.sim_nodes(2)[0].fabric_ip, bed.sim_nodes(2)[1].fabric_ip
    print(f"snapshot: {large} x {large_bytes >> 20} MiB + {small} x {small_bytes >> 10} KiB = {size / 2**30:.2f} GiB")
    sh(HEAD, snapshot_tool_command("manifest", REPO_DIR, "--write").get_raw_value())
    _, settings = settings_of("inventory/sim.py")
    streams = settings.clusters["sim"].config.stage_streams  # as deploys/stage.py runs it on the bed
    # deploys/stage.py's steps (sparkinfra.operations.stage): snapshot_synced (the head's daemon started
    # while the worker's pull starts, in one operation), snapshot_served(present=False)
    serve = transfer.serve_command(REPO_DIR, [worker_ip], head_ip, 8730).get_raw_value()
    pull = transfer.pull_command(REPO_DIR, transfer.source(head_ip, 8730), streams).get_raw_value()
    stop = transfer.unserve_command().get_raw_value()
    to_head, to_worker = (connect(node, control) for node in bed.sim_nodes(2)[:2])

    def transfer_step() -> float:
        started = time.monotonic()
        serving = threading.Thread(target=on, args=(to_head, serve))  # one operation on both hosts at once
        serving.start()
        on(to_worker, pull)  # it waits for the daemon's port
        serving.join()
        on(to_head, stop)
        return time.monotonic() - started

    def ceiling() -> float:  # the raw pipe into a file on the worker's disk
        fresh_start()
        seconds = raw_pipe(worker_ip, CEILING_RECEIVER)
        sh(WORKER, "rm -f /var/tmp/ceiling")
        return seconds

    def seeds() -> float:  # rsync -a over ssh, OpenSSH's default cipher and key exchange (the mesh's user and key)
        fresh_start()
        return timed(HEAD, f"rsync -a -e {shlex.quote(SEEDS_SSH)} {REPO_DIR}/ {worker_ip}:/home/spark2/seeds/")

    def tool() -> float:  # the head's daemon, the worker's pull (its parallel streams), the daemon stopped
        fresh_start()
        return transfer_step()

    methods = {"ceiling": ceiling, "seeds": seeds, "tool": tool}
    order = list(methods)
    figures: dict[str, list[tuple[float, int]]] = {name: [] for name in methods}
    for r in range(rounds):  # rotated: each method runs first, second and last once
        for name in order[r:] + order[:r]:
            figures[name].append(moved(WORKER, methods[name]))
    tool()  # (untimed) the worker holds the tool's copy for the checks below
    digest = json.loads(sh(HEAD, snapshot_tool_command("manifest", REPO_DIR).get_raw_value()).stdout)["digest"]
    warm_head()
    pipe = raw_pipe(worker_ip, "while c.recv(1 << 20): pass")
    # The step's fixed cost: the same transfer with nothing to move (the daemon's unit, the worker's
    # session and sudo, its plan and record, the unit's stop), best of 3.
    fixed = min(transfer_step() for _ in range(best_of))

    # The no-op restage: the worker's check alone, and a whole converge of deploys/stage.py.
    started = time.monotonic()
    check = json.loads(sh(WORKER, snapshot_tool_command("manifest", REPO_DIR).get_raw_value()).stdout)
    noop_check = time.monotonic() - started
    assert check["digest"] == digest, "the worker's copy does not match after staging"
    pyinfra("inventory/sim.py", "deploys/stage.py", *data)  # stages the image too, if needed
    noop_converge = min(pyinfra("inventory/sim.py", "deploys/stage.py", *data) for _ in range(best_of))
    # pyinfra's own floor: start, read the inventory and settings, connect, read one fact.
    floor = min(pyinfra("inventory/sim.py", "fact", "server.Hostname") for _ in range(best_of))

    print(f"raw pipe (TCP into /dev/null) {rate(pipe, size)}")
    labels = {"ceiling": "raw pipe ceiling (TCP to disk)", "seeds": "seeds: rsync -a over ssh     ",
              "tool": f"tool: staging step, {streams} streams"}
    for name, runs in figures.items():
        for i, (seconds, got) in enumerate(runs, 1):
            print(f"{labels[name]} round {i}: {rate(seconds, size)}, spark-2 received {got / 2**20:7.0f} MiB")
        print(f"{labels[name]} spread: {spread([s for s, _ in runs])}")
    ratios = [c / t for (c, _), (t, _) in zip(figures["ceiling"], figures["tool"])]
    ratio = statistics.median(s for s, _ in figures['seeds']) / statistics.median(t for t, _ in figures['tool'])
    print(f"tool/seeds = {ratio:.2f}")
    print(f"no-op restage: worker check {noop_check:.2f} s, whole converge {noop_converge:.2f} s "
          f"(pyinfra's floor: start, connect, one fact {floor:.2f} s; staging's part {noop_converge - floor:.2f} s)")

    # The image: the seeds' pipe vs what deploys/stage.py runs (transfer.image_fanout_command), three
    # rounds in rotated order, each with the bytes the worker received. Then the ID check alone, and
    # an update: the image rebuilt with one changed top layer (the worker has the one before).
    image = bed.IMAGE
    quoted = shlex.quote(image)
    image_size = int(sh(HEAD, f"docker image inspect --format '{{{{.Size}}}}' {quoted}").stdout)
    head_id = sh(HEAD, f"docker image inspect --format '{{{{.Id}}}}' {quoted}").stdout.strip()
    image_methods = {
        "seeds": f"docker save {quoted} | {SEEDS_SSH} {worker_ip} 'sudo -n docker load -q' >/dev/null",
        "tool": transfer.image_fanout_command(image, head_id, [(WORKER, worker_ip)]).get_raw_value(),
    }
    image_times: dict[str, list[tuple[float, int]]] = {"seeds": [], "tool": []}
    for r in range(rounds):
        for name in (["seeds", "tool"] if r % 2 == 0 else ["tool", "seeds"]):
            # A first copy: the worker keeps no image (a lane image built on this one holds its layers).
            sh(WORKER, "docker images -q | sort -u | xargs -r docker rmi -f >/dev/null")
            image_times[name].append(moved(WORKER, lambda method=image_methods[name]: timed(HEAD, method)))
    seeds_bytes = min(b for _, b in image_times["seeds"])
    if any(b < 0.9 * seeds_bytes for _, b in image_times["tool"]):
        raise SystemExit(f"the worker kept layers of {image} (a container holds them): the tool's rounds were no first copy")
    started = time.monotonic()
    got = sh(WORKER, f"docker image inspect --format '{{{{.Id}}}}' {quoted}").stdout.strip()
    id_check = time.monotonic() - started
    assert got == head_id, f"the worker's image is {got or 'missing'} after staging, the head has {head_id}"

    def top_layer(tag: str, mark: str) -> tuple[str, int]:
        """The image with a top layer of TOP_LAYER random bytes (``mark``: each build its own layer)."""
        sh(HEAD, f"printf 'FROM {image}\\nRUN head -c {TOP_LAYER} /dev/urandom > /opt/bench-top  # {mark}\\n' | "
                 f"docker build -q -t {tag} - >/dev/null")
        built = sh(HEAD, f"docker image inspect --format '{{{{.Id}}}}' {tag}").stdout.strip()
        size = int(sh(HEAD, f"docker history --no-trunc --format '{{{{.Size}}}}' --human=false {tag} | head -1").stdout)
        return built, size

    before, after = "sparkbed/stage:bench-top-1", "sparkbed/stage:bench-top-2"
    before_id, _ = top_layer(before, "1")
    timed(HEAD, transfer.image_fanout_command(before, before_id, [(WORKER, worker_ip)]).get_raw_value())
    after_id, layer = top_layer(after, "2")
    update_run = transfer.image_fanout_command(after, after_id, [(WORKER, worker_ip)]).get_raw_value()
    update_seconds, update_bytes = moved(WORKER, lambda: timed(HEAD, update_run))
    assert sh(WORKER, f"docker image inspect --format '{{{{.Id}}}}' {after}").stdout.strip() == after_id
    for tag in (before, after):
        sh(WORKER, f"docker rmi -f {tag} >/dev/null")
        sh(HEAD, f"docker rmi -f {tag} >/dev/null")
    for name, runs in image_times.items():
        print(f"image {image_size / 1e6:.0f} MB, {name}: " + ", ".join(
            f"{s:.2f} s ({b / 2**20:.0f} MiB received)" for s, b in runs) + f"; {spread([s for s, _ in runs])}")
    seeds_image = statistics.median(s for s, _ in image_times["seeds"])
    tool_image = statistics.median(s for s, _ in image_times["tool"])
    print(f"image first copy, median of {rounds}: seeds {seeds_image:.2f} s, tool {tool_image:.2f} s "
          f"(tool/seeds = {seeds_image / tool_image:.2f}); ID check when equal {id_check:.2f} s per node")
    print(f"image update (the top layer, {layer / 2**20:.0f} MiB, changed): tool {update_seconds:.2f} s, "
          f"spark-2 received {update_bytes / 2**20:.1f} MiB = {update_bytes / layer:.2f}x the layer")
    sh(WORKER, f"rm -rf {REPO_DIR} /home/spark2/seeds")
    sh(HEAD, f"rm -rf {REPO_DIR}")
    print(f"staging/pipe-into-null = {pipe / statistics.median(t for t, _ in figures['tool']):.2f}")
    per_byte = [c / (t - fixed) for (c, _), (t, _) in zip(figures["ceiling"], figures["tool"])]
    print(f"the step's fixed cost (a transfer with nothing to move) {fixed:.2f} s; without it, "
          f"staging/ceiling each round: {' '.join(f'{r:.2f}' for r in per_byte)}")
    print(f"staging/ceiling = {min(ratios):.2f} (each round: {' '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
