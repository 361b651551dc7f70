"""lane_ctl.py's trial plans: the lane's own plan with one knob changed, as GMU bracketing starts it."""

from __future__ import annotations

import importlib.util
import stat

import pytest

from sparkinfra import serving


@pytest.fixture
def ctl(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("lane_ctl", serving.LANE_CTL_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "PLANS", tmp_path / "plans")
    monkeypatch.setattr(module, "MARKS", tmp_path / "marks")
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "sim.env").write_text("A=1\nVLLM_CPU_KVCACHE_SPACE=1\nB=2\n")
    return module


def _plan(ctl):
    return {
        "container": "vllm_node",
        "image": "img:1",
        "docker_options": ["--network", "host", "--env-file", "/etc/sparkinfra/nccl.env",
                           "--env-file", str(ctl.PLANS / "sim.env"), "-v", "/a:/a:ro"],
        "command": ["vllm", "serve", "org/m", "--gpu-memory-utilization", "0.9", "--max-model-len", "512"],
    }


def test_flag_knob_replaces_the_value(ctl):
    p = _plan(ctl)
    q = ctl.trial_plan("sim", p, "--gpu-memory-utilization", "0.929")
    assert q["command"] == ["vllm", "serve", "org/m", "--gpu-memory-utilization", "0.929", "--max-model-len", "512"]
    assert q["container"] == "vllm_node-trial" and q["docker_options"] == p["docker_options"]
    assert p["command"][4] == "0.9"  # the lane's plan itself is untouched


def test_flag_knob_in_equals_form_and_missing(ctl):
    p = _plan(ctl)
    p["command"][3:5] = ["--gpu-memory-utilization=0.9"]
    assert "--gpu-memory-utilization=0.5" in ctl.trial_plan("sim", p, "--gpu-memory-utilization", "0.5")["command"]
    q = ctl.trial_plan("sim", p, "--kv-cache-memory-bytes", "1000")
    assert q["command"][-2:] == ["--kv-cache-memory-bytes", "1000"]


def test_env_knob_goes_to_a_root_only_copy_of_the_env_file(ctl):
    p = _plan(ctl)
    q = ctl.trial_plan("sim", p, "VLLM_CPU_KVCACHE_SPACE", "3")
    trial_env = ctl.MARKS / "sim.trial.env"
    assert trial_env.read_text() == "A=1\nB=2\nVLLM_CPU_KVCACHE_SPACE=3\n"
    assert stat.S_IMODE(trial_env.stat().st_mode) == 0o600
    assert q["docker_options"][5] == str(trial_env) and p["docker_options"][5] == str(ctl.PLANS / "sim.env")
    assert q["command"] == p["command"]
