"""
``node/container_check.py``, run as a rank's container runs it: the NCCL pin as libraries load
it (two stand-in libnccl.so.2 versions, compiled here; with ``--nccl-pin``, two builds of one
version too), the RDMA devices and a GID table in folders standing for /dev/infiniband and
/sys/class/infiniband.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gb10 import v4
from nccl_builds import compile_build
from spark_cluster import load_cluster

from sparkbed.layout import compile_nccl_standin
from sparkinfra import node, serving
from sparkinfra.lanes import find_lane


@pytest.fixture(scope="module")
def nccl(tmp_path_factory) -> dict[str, Path]:
    """libnccl.so.2 stand-ins reporting 2.30.7 (the pin) and 2.29.7 (an image's own copy)."""
    return {v: compile_nccl_standin(v, tmp_path_factory.mktemp(v) / "libnccl.so.2") for v in ("2.30.7", "2.29.7")}


def run(*args: str, root: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """The script as a container runs it; ``root`` stands for the container's / (default: an empty tree)."""
    if root is None:
        root = Path(env.get("LD_PRELOAD") or env.get("VLLM_NCCL_SO_PATH") or "/nonexistent").parent / "empty"
    return subprocess.run([sys.executable, "-S", str(node.DIR / "container_check.py"), *args, "--root", str(root)],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env}, timeout=60, check=False)


SYSTEM_COPY = "usr/lib/x86_64-linux-gnu/libnccl.so.2"
PIP_COPY = "usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"


@pytest.fixture
def image(tmp_path, nccl) -> Path:
    """An image's tree carrying its own 2.29.7 at the system's and pip's places (with the symlink
    Debian's package adds), and a file that only looks like one."""
    for copy in (SYSTEM_COPY, PIP_COPY):
        (tmp_path / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nccl["2.29.7"], tmp_path / copy)
    (tmp_path / SYSTEM_COPY).with_name("libnccl.so").symlink_to("libnccl.so.2")
    (tmp_path / "usr/share/doc/libnccl.so.2.txt").parent.mkdir(parents=True)
    (tmp_path / "usr/share/doc/libnccl.so.2.txt").write_text("not a library\n")
    return tmp_path


def test_every_libnccl_file_is_found_and_no_symlink(image):
    done = run("--find-nccl", root=image)
    assert done.stdout.split() == [str(image / SYSTEM_COPY), str(image / PIP_COPY)]


def test_an_image_copy_the_pin_is_not_mounted_over_is_named(image, nccl):
    """LD_PRELOAD reaches what loads libnccl.so.2 by name; torch loads pip's copy by its path."""
    done = run("--nccl-version", "2.30.7", root=image, LD_PRELOAD=str(nccl["2.30.7"]),
               VLLM_NCCL_SO_PATH=str(nccl["2.30.7"]))
    assert done.returncode == 1
    assert (f"FAIL nccl: {image / SYSTEM_COPY} is 2.29.7; {image / PIP_COPY} is 2.29.7, the pin is 2.30.7 "
            f"(LD_PRELOAD {nccl['2.30.7']})") in done.stdout, done.stdout


def test_the_pin_over_every_copy_passes(image, nccl):
    for copy in (SYSTEM_COPY, PIP_COPY):  # what lane_ctl's read-only mounts make of each path
        shutil.copy(nccl["2.30.7"], image / copy)
    # no LD_PRELOAD: by name, the dynamic loader finds the system's path, the pin mounted over it
    done = run("--nccl-version", "2.30.7", root=image, VLLM_NCCL_SO_PATH=str(nccl["2.30.7"]),
               LD_LIBRARY_PATH=str((image / SYSTEM_COPY).parent))
    assert done.returncode == 0, done.stdout
    assert "and 2 copies in the image" in done.stdout


def test_the_pin_preloaded_passes(nccl):
    done = run("--nccl-version", "2.30.7", LD_PRELOAD=str(nccl["2.30.7"]), VLLM_NCCL_SO_PATH=str(nccl["2.30.7"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("container check: PASS nccl: 2.30.7 through libnccl.so.2, VLLM_NCCL_SO_PATH ")


def test_the_images_own_copy_is_named_with_its_version(nccl):
    """What LD_PRELOAD reaching only one path looks like: libraries that load libnccl.so.2 by name
    get the image's copy while VLLM_NCCL_SO_PATH still names the pin."""
    done = run("--nccl-version", "2.30.7", LD_PRELOAD=str(nccl["2.29.7"]), VLLM_NCCL_SO_PATH=str(nccl["2.30.7"]))
    assert done.returncode == 1
    assert f"FAIL nccl: libnccl.so.2 is 2.29.7, the pin is 2.30.7 (LD_PRELOAD {nccl['2.29.7']})" in done.stdout


def test_no_pin_and_no_copy_is_not_loadable():
    done = run("--nccl-version", "2.30.7")
    assert done.returncode == 1 and "FAIL nccl: libnccl.so.2 is not loadable, the pin is 2.30.7 (LD_PRELOAD unset)" in done.stdout


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """The pin and another build of its version (2.30.7), and a 2.29.7: libnccl.so.2 each."""
    root = tmp_path_factory.mktemp("builds")
    return {"pin": compile_build(root / "pin" / "libnccl.so.2", "pin"),
            "other": compile_build(root / "other" / "libnccl.so.2", "other"),
            "old": compile_build(root / "old" / "libnccl.so.2", "old", 22907)}


def short(path: Path) -> str:
    """``build-id X, sha256 Y`` of a file, 12 hex each."""
    out = subprocess.run([sys.executable, str((node.DIR / "container_check.py").with_name("nccl_identity.py")), str(path)],
                         capture_output=True, text=True, check=True).stdout
    found = json.loads(out)[0]
    return f"build-id {found['build_id'][:12]}, sha256 {found['sha256'][:12]}"


def test_the_pin_by_its_bytes_passes(builds, tmp_path):
    pin = builds["pin"]
    done = run("--nccl-pin", str(pin), "--nccl-version", "2.30.7", root=tmp_path, LD_PRELOAD=str(pin),
               VLLM_NCCL_SO_PATH=str(pin))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (f"container check: PASS nccl: 2.30.7 {short(pin).replace(',', '')} through libnccl.so.2, "
                           f"VLLM_NCCL_SO_PATH {pin}\n")


def test_another_build_of_the_pins_version_is_named(builds, tmp_path):
    """What a version check passes: LD_PRELOAD names a 2.30.7 that is not the pin's file."""
    pin, other = builds["pin"], builds["other"]
    done = run("--nccl-pin", str(pin), root=tmp_path, LD_PRELOAD=str(other), VLLM_NCCL_SO_PATH=str(pin))
    assert done.returncode == 1
    assert done.stdout == (f"container check: FAIL nccl: libnccl.so.2 ({other}) is 2.30.7 but another build "
                           f"({short(other)}), the pin is 2.30.7 {short(pin).replace(',', '')} (LD_PRELOAD {other})\n")
    assert run("--nccl-version", "2.30.7", root=tmp_path, LD_PRELOAD=str(other),
               VLLM_NCCL_SO_PATH=str(pin)).returncode == 0  # the version alone cannot tell


def test_every_copy_is_compared_by_its_bytes(builds, image):
    """The pin mounted over pip's copy; the system's is another 2.30.7 build and what the name loads."""
    pin = builds["pin"]
    shutil.copy(pin, image / PIP_COPY)
    shutil.copy(builds["other"], image / SYSTEM_COPY)
    done = run("--nccl-pin", str(pin), root=image, VLLM_NCCL_SO_PATH=str(pin),
               LD_LIBRARY_PATH=str((image / SYSTEM_COPY).parent))
    assert done.returncode == 1
    other = short(builds["other"])
    assert (f"FAIL nccl: libnccl.so.2 ({image / SYSTEM_COPY}) is 2.30.7 but another build ({other}); "
            f"{image / SYSTEM_COPY} is 2.30.7 but another build ({other}), the pin is 2.30.7 ") in done.stdout
    assert str(image / PIP_COPY) not in done.stdout
    shutil.copy(builds["old"], image / SYSTEM_COPY)
    done = run("--nccl-pin", str(pin), root=image, VLLM_NCCL_SO_PATH=str(pin), LD_PRELOAD=str(pin))
    assert f"FAIL nccl: {image / SYSTEM_COPY} is 2.29.7, the pin is 2.30.7 " in done.stdout
    shutil.copy(pin, image / SYSTEM_COPY)
    done = run("--nccl-pin", str(pin), root=image, VLLM_NCCL_SO_PATH=str(pin),
               LD_LIBRARY_PATH=str((image / SYSTEM_COPY).parent))
    assert done.returncode == 0 and done.stdout.startswith(
        f"container check: PASS nccl: 2.30.7 build-id {short(pin)[9:21]} sha256 ")
    assert f"through libnccl.so.2 ({image / SYSTEM_COPY}), VLLM_NCCL_SO_PATH {pin} and 2 copies" in done.stdout


def test_a_pin_of_another_version_or_none(builds, tmp_path):
    done = run("--nccl-pin", str(builds["old"]), "--nccl-version", "2.30.7", root=tmp_path, LD_PRELOAD=str(builds["old"]))
    assert done.returncode == 1 and f"FAIL nccl: the pin {builds['old']} is 2.29.7, not 2.30.7" in done.stdout
    done = run("--nccl-pin", str(tmp_path / "none"), root=tmp_path)
    assert done.returncode == 1 and f"FAIL nccl: the pin {tmp_path / 'none'} is no such file" in done.stdout


def test_the_script_alone_checks_versions_and_says_what_a_pin_needs(builds, tmp_path):
    """Mounted alone (without nccl_identity.py beside it): the version check as before; a pin
    check names the missing file."""
    alone = tmp_path / "run" / "container_check.py"
    alone.parent.mkdir()
    shutil.copy((node.DIR / "container_check.py"), alone)
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(builds["pin"])}
    done = subprocess.run([sys.executable, "-S", str(alone), "--nccl-version", "2.30.7", "--root", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("container check: PASS nccl: 2.30.7 through"), done.stdout
    done = subprocess.run([sys.executable, "-S", str(alone), "--nccl-pin", str(builds["pin"]), "--root", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 1 and done.stdout == (
        f"container check: FAIL nccl: nccl_identity.py is not beside container_check.py in {alone.parent}: "
        "--nccl-pin cannot compare builds\n")


V1, V2 = "IB/RoCE v1", "RoCE v2"
LL = "fe80:0000:0000:0000:0000:0000:0000:0001"


def gid_table(root, hca: str, netdev: str, rows: list[tuple[int, str, str]]) -> None:
    """A GID table in ``root``'s fabricated sysfs, each row of ``netdev`` (the HCA's own)."""
    port = root / "sys" / hca / "ports" / "1"
    for part in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / part).mkdir(parents=True, exist_ok=True)
    (root / "sys" / hca / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
    (port / "state").write_text("4: ACTIVE\n")
    for index in range(8):
        gid, kind = next(((g, k) for i, g, k in rows if i == index), ("0000:" * 7 + "0000", ""))
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + ("\n" if kind else ""))
        (port / "gid_attrs" / "ndevs" / str(index)).write_text(netdev + "\n" if kind else "")


@pytest.fixture
def fabric(tmp_path, monkeypatch):
    """The check module with /dev/infiniband and /sys/class/infiniband in ``tmp_path``: a GB10's twins
    of the cabled port, rocep1s0f0 (enp1s0f0np0, the fabric IP 10.0.0.1 at row 3) and roceP2p1s0f0
    (enP2p1s0f0np0, its own link-local IPv4 at row 3), each table from its own netdev."""
    spec = importlib.util.spec_from_file_location("container_check", (node.DIR / "container_check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "uverbs0").touch()
    (tmp_path / "dev" / "uverbs1").touch()
    gid_table(tmp_path, "rocep1s0f0", "enp1s0f0np0", [(0, LL, V1), (1, LL, V2), (2, v4("10.0.0.1"), V1), (3, v4("10.0.0.1"), V2)])
    gid_table(tmp_path, "roceP2p1s0f0", "enP2p1s0f0np0",
              [(0, LL, V1), (1, LL, V2), (2, v4("169.254.0.1"), V1), (3, v4("169.254.0.1"), V2)])
    monkeypatch.setattr(check, "DEVICES", str(tmp_path / "dev"))
    monkeypatch.setattr(check, "SYSFS", str(tmp_path / "sys"))
    monkeypatch.setenv("NCCL_IB_HCA", "=rocep1s0f0:1,roceP2p1s0f0:1")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "enp1s0f0np0")
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.1")
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "3")
    return check, tmp_path


def test_devices_port_and_both_twins_rows_pass(fabric):
    check, _ = fabric
    assert check.check_rdma(1) == (True, "uverbs0 uverbs1; rocep1s0f0, roceP2p1s0f0 port 1 ACTIVE")
    assert check.check_gid(1) == (True, "row 3 of rocep1s0f0 (enp1s0f0np0), roceP2p1s0f0 (enP2p1s0f0np0) port 1 is "
                                        "IPv4 RoCE v2 of each one's own netdev, 10.0.0.1 on rocep1s0f0")


def test_a_gid_index_of_another_row_is_refused(fabric, monkeypatch):
    check, _ = fabric
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "0")
    ok, detail = check.check_gid(1)
    assert not ok and f"rocep1s0f0 (enp1s0f0np0) port 1: row 0 is {LL} (IB/RoCE v1), not an IPv4 RoCE v2 GID" in detail


def test_a_twin_whose_row_at_the_index_is_not_ipv4_is_named(fabric, monkeypatch):
    """The twin's IPv4 moved to row 5 (an IPv6 address took rows 2/3 first): row 3 there is IPv6."""
    check, root = fabric
    gid_table(root, "roceP2p1s0f0", "enP2p1s0f0np0", [
        (0, LL, V1), (1, LL, V2), (2, "fd00:0213:0001:0000:0000:0000:0000:0002", V1),
        (3, "fd00:0213:0001:0000:0000:0000:0000:0002", V2), (4, v4("169.254.0.1"), V1), (5, v4("169.254.0.1"), V2)])
    ok, detail = check.check_gid(1)
    assert not ok
    assert detail == ("roceP2p1s0f0 (enP2p1s0f0np0) port 1: row 3 is fd00:0213:0001:0000:0000:0000:0000:0002 (RoCE v2), "
                      "not an IPv4 RoCE v2 GID")
    monkeypatch.delenv("NCCL_IB_GID_INDEX")  # left to NCCL: each HCA's own first IPv4 row (3 and 5)
    assert check.check_gid(1) == (True, "NCCL picks each HCA's IPv4 RoCE v2 row on rocep1s0f0 (enp1s0f0np0), "
                                        "roceP2p1s0f0 (enP2p1s0f0np0) port 1, 10.0.0.1 on rocep1s0f0")


def test_the_fabric_hca_must_carry_the_fabric_address(fabric, monkeypatch):
    """The twin's table never holds the fabric IP; the fabric interface's HCA must (a site's two HCAs
    swapped, or the fabric IP on the wrong twin, is named)."""
    check, _ = fabric
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "enP2p1s0f0np0")
    ok, detail = check.check_gid(1)
    assert not ok and detail == ("roceP2p1s0f0 (enP2p1s0f0np0) port 1: row 3 is RoCE v2 for 169.254.0.1, "
                                 "not for the fabric address 10.0.0.1")


def test_no_device_in_the_container_and_a_port_down_are_named(fabric):
    check, root = fabric
    (root / "sys" / "roceP2p1s0f0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    assert check.check_rdma(1) == (False, "roceP2p1s0f0 port 1: 1: DOWN")
    (root / "dev" / "uverbs0").unlink()
    (root / "dev" / "uverbs1").unlink()
    ok, detail = check.check_rdma(1)
    assert not ok and detail.startswith(f"no {root}/dev/uverbs* in the container")


def test_every_rank_of_a_lane_using_rdma_checks_it(tmp_path):
    """The plan hands the check its arguments: the pin, and RDMA only where the lane uses it."""
    cluster = load_cluster(tmp_path, {"model": "Sebesky/MiniMax-M3-W4A16-GPTQ",
                                      "drafter": "Sebesky/MiniMax-M3-EAGLE3-RTN-INT4"})
    lane = find_lane("pair-a-balanced").model_copy(update={"mods": []})  # its build repository's: not fetched here
    for plan in serving.rank_plans(lane, cluster):
        check = plan.runner_plan().container_check
        assert check.args == ["--nccl-version", cluster.config.nccl_version, "--nccl-pin", cluster.config.nccl_library,
                              "--rdma", "--rdma-port", "1"]
        assert (node.DIR / "nccl_identity.py").is_file()  # mounted with the whole folder: imported beside it
    sim = find_lane("sim")
    cpu = sim.model_copy(update={"model": cluster.config.model, "nodes": 2,
                                 "container": sim.container.model_copy(update={"rdma": False})})
    assert {tuple(p.check_args) for p in serving.rank_plans(cpu, cluster)} == {
        ("--nccl-version", cluster.config.nccl_version, "--nccl-pin", cluster.config.nccl_library)}
