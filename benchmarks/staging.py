"""
Staging speed on the bed, head -> worker over the simulated fabric, measured in one run.

    python benchmarks/staging.py            # as root; brings the bed up (2 nodes) if it is not

Prints, for a synthetic snapshot (>= 2 GiB: a few large shards, many small files, random content):
the raw pipe (TCP, no protocol) into /dev/null and, as the ceiling, into a file on the worker's disk
(the path any copy of the snapshot must take), the seeds' method (``rsync -a`` over ssh, default cipher),
the tool's staging step (what ``deploys/stage.py`` runs), and the no-op restage (the worker's check,
a whole ``pyinfra … deploys/stage.py`` run, and pyinfra's floor: a run that only connects and reads
one fact; best of 3 each); then the same for
the image (``docker save | ssh | docker load`` against the tool's fan-out script, alternated, best of
two each, and the ID check when the IDs already match). Last line: ``staging/ceiling = R``. All nodes share this machine's cores:
compare the figures with each other, not with a real 200G link.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sparkbed as bed
from sparkinfra import transfer  # noqa: E402
from sparkinfra.facts.stage import snapshot_tool_command

HEAD, WORKER = "spark-1", "spark-2"
REPO, REV = "sparkbed/bench-moe", "bench000000000000000000000000000000000001"
CACHE = "/var/lib/sparkinfra/hf"
REPO_DIR = transfer.repo_dir(CACHE, REPO)
LARGE, LARGE_BYTES, SMALL, SMALL_BYTES = 4, 512 << 20, 400, 64 << 10
PY = str(Path(sys.executable))


def sh(node: str, command: str) -> subprocess.CompletedProcess:
    return bed.node_exec(node, "bash", "-c", command)


def timed(node: str, command: str) -> float:
    started = time.monotonic()
    sh(node, command)
    return time.monotonic() - started


def drop_worker_copy() -> None:
    sh(WORKER, f"rm -rf {REPO_DIR} /home/spark2/seeds; sync")


def rate(seconds: float, size: int) -> str:
    return f"{size / seconds / 1e6:8.0f} MB/s  ({seconds:6.2f} s)"


def pyinfra(*args: str) -> float:
    started = time.monotonic()
    subprocess.run(
        ["ip", "netns", "exec", bed.MGMT_NS, str(Path(PY).parent / "pyinfra"), "-y", *args],
        cwd=ROOT, check=True, capture_output=True, stdin=subprocess.DEVNULL,
    )
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
    if bed.container_pid(HEAD) is None or bed.container_pid(WORKER) is None:
        bed.up(2)
    data = ["--data", f"model={REPO}", "--data", f"model_revision={REV}", "--data", "lane="]
    pyinfra("inventory/sim.py", "deploys/prepare.py")
    bed.make_snapshot(bed.node_dir(HEAD) / f"root{CACHE}", REPO, REV, large=LARGE, large_bytes=LARGE_BYTES,
                      small=SMALL, small_bytes=SMALL_BYTES, seed=1)
    sh(HEAD, f"cat {REPO_DIR}/blobs/* > /dev/null")  # every method reads from the page cache
    size = int(sh(HEAD, f"du -sbL {REPO_DIR}/blobs | cut -f1").stdout.split()[0])
    head_ip, worker_ip = bed.sim_nodes(2)[0].fabric_ip, bed.sim_nodes(2)[1].fabric_ip
    print(f"snapshot: {LARGE} x {LARGE_BYTES >> 20} MiB + {SMALL} x {SMALL_BYTES >> 10} KiB = {size / 2**30:.2f} GiB")

    # 1. The raw pipe: bytes over TCP, no protocol, into /dev/null; then into a file on the worker's
    # disk (the path every copy of the snapshot takes): the ceiling.
    pipe = raw_pipe(worker_ip, "while c.recv(1 << 20): pass")
    ceiling = raw_pipe(worker_ip, "f = open('/var/tmp/ceiling', 'wb')\nwhile (b := c.recv(1 << 20)): f.write(b)")
    sh(WORKER, "rm -f /var/tmp/ceiling")

    # 2. The seeds' method: rsync -a over ssh, default cipher (through the head's SSH mesh).
    drop_worker_copy()
    seeds = timed(HEAD, f"rsync -a {REPO_DIR}/ {worker_ip}:/home/spark2/seeds/")

    # 3. The tool: what snapshot_on_workers runs (daemon on the fabric, the worker's parallel pulls).
    drop_worker_copy()
    sh(HEAD, snapshot_tool_command("manifest", REPO_DIR, "--write").get_raw_value())
    started = time.monotonic()
    sh(HEAD, transfer.head_transfer_command(REPO_DIR, [worker_ip], head_ip, 8730, 8).get_raw_value())
    tool = time.monotonic() - started
    digest = json.loads(sh(HEAD, snapshot_tool_command("manifest", REPO_DIR).get_raw_value()).stdout)["digest"]

    # 4. The no-op restage: the worker's check alone, and a whole converge of deploys/stage.py.
    started = time.monotonic()
    check = json.loads(sh(WORKER, snapshot_tool_command("manifest", REPO_DIR).get_raw_value()).stdout)
    noop_check = time.monotonic() - started
    assert check["digest"] == digest, "the worker's copy does not match after staging"
    pyinfra("inventory/sim.py", "deploys/stage.py", *data)  # stages the image too, if needed
    noop_converge = min(pyinfra("inventory/sim.py", "deploys/stage.py", *data) for _ in range(3))
    # pyinfra's own floor: start, read the inventory and settings, connect, read one fact.
    floor = min(pyinfra("inventory/sim.py", "fact", "server.Hostname") for _ in range(3))

    print(f"raw pipe (TCP into /dev/null) {rate(pipe, size)}")
    print(f"raw pipe ceiling (TCP to disk){rate(ceiling, size)}")
    print(f"seeds: rsync -a over ssh      {rate(seeds, size)}")
    print(f"tool: staging step            {rate(tool, size)}")
    print(f"tool/seeds = {seeds / tool:.2f}")
    print(f"no-op restage: worker check {noop_check:.2f} s, whole converge {noop_converge:.2f} s "
          f"(pyinfra's floor: start, connect, one fact {floor:.2f} s; staging's part {noop_converge - floor:.2f} s)")

    # The image: the seeds' pipe vs what deploys/stage.py runs (transfer.image_fanout_command: one save
    # teed to each worker's load, then the ID check), each twice in the order seeds, tool, tool, seeds
    # (the second of two runs finds warmer caches); best of each. Then the ID check alone, timed.
    image = bed.IMAGE
    quoted = shlex.quote(image)
    image_size = int(sh(HEAD, f"docker image inspect --format '{{{{.Size}}}}' {quoted}").stdout)
    head_id = sh(HEAD, f"docker image inspect --format '{{{{.Id}}}}' {quoted}").stdout.strip()
    methods = {
        "seeds": f"docker save {quoted} | ssh {worker_ip} 'sudo -n docker load -q' >/dev/null",
        "tool": transfer.image_fanout_command(image, head_id, [(WORKER, worker_ip)]).get_raw_value(),
    }
    image_times: dict[str, list[float]] = {"seeds": [], "tool": []}
    for name in ("seeds", "tool", "tool", "seeds"):
        sh(WORKER, f"docker rmi -f {quoted} >/dev/null")
        image_times[name].append(timed(HEAD, methods[name]))
    started = time.monotonic()
    got = sh(WORKER, f"docker image inspect --format '{{{{.Id}}}}' {quoted}").stdout.strip()
    id_check = time.monotonic() - started
    assert got == head_id, f"the worker's image is {got or 'missing'} after staging, the head has {head_id}"
    seeds_image, tool_image = min(image_times["seeds"]), min(image_times["tool"])
    print(f"image {image_size / 1e6:.0f} MB (best of 2, alternated): seeds docker save|ssh|load "
          f"{seeds_image:.2f} s, tool (image_fanout_command) {tool_image:.2f} s, "
          f"ID check when equal {id_check:.2f} s per node")
    sh(WORKER, f"rm -rf {REPO_DIR} /home/spark2/seeds")
    sh(HEAD, f"rm -rf {REPO_DIR}")
    print(f"staging/pipe-into-null = {pipe / tool:.2f}")
    print(f"staging/ceiling = {ceiling / tool:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
