"""
``scripts/container_check.py``, run as a rank's container runs it: the NCCL pin as libraries load
it (two stand-in libnccl.so.2 builds, compiled here), the RDMA devices and a GID table in folders
standing for /dev/infiniband and /sys/class/infiniband.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from spark_cluster import load_cluster

from sparkbed.layout import compile_nccl_standin
from sparkinfra import serving
from sparkinfra.lanes import find_lane

@pytest.fixture(scope="module")
def nccl(tmp_path_factory) -> dict[str, Path]:
    """libnccl.so.2 stand-ins reporting 2.30.7 (the pin) and 2.29.7 (an image's own copy)."""
    return {v: compile_nccl_standin(v, tmp_path_factory.mktemp(v) / "libnccl.so.2") for v in ("2.30.7", "2.29.7")}


def run(*args: str, root: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """The script as a container runs it; ``root`` stands for the container's / (default: an empty tree)."""
    if root is None:
        root = Path(env.get("LD_PRELOAD") or env.get("VLLM_NCCL_SO_PATH") or "/nonexistent").parent / "empty"
    return subprocess.run([sys.executable, "-S", str(serving.CONTAINER_CHECK_SOURCE), *args, "--root", str(root)],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env}, timeout=60)


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


@pytest.fixture
def fabric(tmp_path, monkeypatch):
    """The check module with /dev/infiniband and /sys/class/infiniband in ``tmp_path``: HCA roce0,
    port 1 ACTIVE, GID rows 0 (IPv6 link-local, RoCE v1) and 3 (10.0.0.1, RoCE v2)."""
    spec = importlib.util.spec_from_file_location("container_check", serving.CONTAINER_CHECK_SOURCE)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "uverbs0").touch()
    port = tmp_path / "sys" / "roce0" / "ports" / "1"
    for part in ("gids", "gid_attrs/types"):
        (port / part).mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    for index, gid, kind in ((0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                             (3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")):
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
    monkeypatch.setattr(check, "DEVICES", str(tmp_path / "dev"))
    monkeypatch.setattr(check, "SYSFS", str(tmp_path / "sys"))
    monkeypatch.setenv("NCCL_IB_HCA", "=roce0:1")
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.1")
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "3")
    return check, tmp_path


def test_devices_port_and_gid_row_pass(fabric):
    check, _ = fabric
    assert check.check_rdma(1) == (True, "uverbs0; roce0 port 1 ACTIVE")
    assert check.check_gid(1) == (True, "row 3 of roce0 port 1 is RoCE v2 for 10.0.0.1")


def test_a_gid_index_of_another_row_is_refused(fabric, monkeypatch):
    check, _ = fabric
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "0")
    ok, detail = check.check_gid(1)
    assert not ok and "row 0 of roce0 port 1 is fe80:0000:0000:0000:0000:0000:0000:0001 (IB/RoCE v1), not RoCE v2" in detail


def test_no_device_in_the_container_and_a_port_down_are_named(fabric):
    check, root = fabric
    (root / "sys" / "roce0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    assert check.check_rdma(1) == (False, "roce0 port 1: 1: DOWN")
    (root / "dev" / "uverbs0").unlink()
    ok, detail = check.check_rdma(1)
    assert not ok and detail.startswith(f"no {root}/dev/uverbs* in the container")


def test_every_rank_of_a_lane_using_rdma_checks_it(tmp_path):
    """The plan hands the check its arguments: the pin, and RDMA only where the lane uses it."""
    cluster = load_cluster(tmp_path, {"model": "Sebesky/MiniMax-M3-W4A16-GPTQ",
                                      "drafter": "Sebesky/MiniMax-M3-EAGLE3-RTN-INT4"})
    for plan in serving.rank_plans(find_lane("pair-a-balanced"), cluster):
        assert plan.runner_plan()["container_check"]["args"] == ["--nccl-version", cluster.config.nccl_version,
                                                                "--rdma", "--rdma-port", "1"]
    sim = find_lane("sim")
    cpu = sim.model_copy(update={"model": cluster.config.model, "nodes": 2,
                                 "container": sim.container.model_copy(update={"rdma": False})})
    assert {tuple(p.check_args) for p in serving.rank_plans(cpu, cluster)} == {("--nccl-version", cluster.config.nccl_version)}
