"""
What the bed's lane image recipe (``images/sparkbed-lane``) adds at its paths in the image, against the
controller's own vLLM CPU build and Ray (the ``sim`` extra, the tree the bed mounts into the image):
the ``vllm.platform_plugins`` entry point vLLM finds, the Ray device it names, the communicator it
resolves, and the ``ray`` command's stand-in GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkinfra.lanes import load_recipe

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
