"""
Recipes as the community publishes them (``sparkinfra.lanes.imports``): the corpus under
``tests/unit/recipes/<format>/`` (written here after each format's published schema) imports, each
lane as its golden file says (``tests/unit/golden/recipes/``: the lane, its image recipe, the site
settings and the account of every key) and its rendered ``vllm serve`` arguments and env checked
field by field against the recipe; a fork's recipe with ``$HF_TOKEN``, a mod group and a vLLM ref and
PR imports from its checkout; a URL import records the ref, never a made-up commit; every shipped
lane exported to eugr and to sparkrun imports back to the same serve command and env.

``SPARKINFRA_REGOLD=1`` rewrites the golden files (then read the diff).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from golden_files import golden

from sparkinfra.lanes import LANES_DIR, LaneError, find_lane, launch
from sparkinfra.lanes.export import export_lane
from sparkinfra.lanes.imports import import_recipe, recipe_format
from sparkinfra.lanes.render import lane_yaml
from sparkinfra.lanes.schema import read_yaml

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "recipes"
GOLDEN = HERE / "golden" / "recipes"
FILES = sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.glob("*/*.yaml"))
SHIPPED = sorted(p.stem for p in LANES_DIR.glob("*.yaml"))




def account(imported) -> str:
    parts = [f"# lane {imported.lane.name}", lane_yaml(imported.lane)]
    if imported.image:
        parts += ["# image recipe", yaml.safe_dump(imported.image, sort_keys=False, width=100)]
    parts += ["# site", "".join(f"--data {k}={v}\n" for k, v in imported.site.items())]
    parts += ["# account", "".join(f"{note}\n" for note in imported.notes)]
    return "\n".join(parts)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A fork of eugr's repository: its mods (one a mod group) committed in a git checkout."""
    root = tmp_path / "spark-vllm-docker"
    shutil.copytree(CORPUS / "checkout", root)
    shutil.copy(CORPUS / "eugr" / "m3-group-pr.yaml", root / "m3-group-pr.yaml")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["remote", "add", "origin", "git@github.com:someone/spark-vllm-docker.git"],
                 ["add", "-A"], ["commit", "-q", "-m", "fork"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)
    return root


def test_the_format_is_told_by_its_keys():
    assert {name: recipe_format(read_yaml(CORPUS / name, name)[0]) for name in FILES} == {
        name: name.split("/")[0] for name in FILES
    }
    assert recipe_format({"recipe_version": "2", "model": "a/b"}) == "sparkrun"  # both v2s say "2"
    assert recipe_format({"recipe_version": "2", "model": "a/b", "params": {}}) == "pulse"
    assert recipe_format({"recipe_version": "1", "name": "x", "command": "vllm serve a/b"}) == "eugr"
    assert recipe_format({"recipe_version": "1", "model": "a/b", "runtime": "vllm"}) == "sparkrun"


@pytest.mark.parametrize("name", [n for n in FILES if "hooks" not in n])
def test_corpus_imports_as_golden(name):
    for imported in import_recipe(str(CORPUS / name)):
        golden(GOLDEN / name.removesuffix(".yaml") / f"{imported.lane.name}.txt", account(imported))


def rank0(imported, cluster_of) -> tuple[list[str], dict[str, str]]:
    lane = imported.lane  # an image recipe of its own is not here: the cluster's image instead
    lane = lane if isinstance(lane.image, str) or lane.image is None else lane.model_copy(update={"image": None})
    rendered = launch(lane, cluster_of(lane), 0)
    return rendered.serve_args, rendered.env


def flag(args: list[str], name: str) -> str | bool:
    if name not in args:
        return False
    at = args.index(name)
    return args[at + 1] if at + 1 < len(args) and not args[at + 1].startswith("--") else True


def test_sparkrun_fields_and_one_lane_per_cluster_size(cluster_of):
    pair, quad = import_recipe(str(CORPUS / "sparkrun" / "qwen-overrides.yaml"))
    assert (pair.lane.name, pair.lane.nodes, quad.lane.name, quad.lane.nodes) == (
        "qwen-overrides", 2, "qwen-overrides-4n", 4)
    for imported, tp, gmu, length in ((pair, "2", "0.85", "65536"), (quad, "4", "0.88", "131072")):
        args, env = rank0(imported, cluster_of)
        assert args[0] == "Qwen/Qwen3-235B-A22B-FP8"
        assert flag(args, "--tensor-parallel-size") == tp and flag(args, "--gpu-memory-utilization") == gmu
        assert flag(args, "--max-model-len") == length and flag(args, "--served-model-name") == "qwen3-235b"
        assert flag(args, "--tool-call-parser") == "hermes" and flag(args, "--kv-cache-dtype") == "fp8"
        assert flag(args, "--enable-auto-tool-choice") is True and flag(args, "--enable-prefix-caching") is True
        assert flag(args, "--port") == "8000" and flag(args, "--nnodes") == str(imported.lane.nodes)
        assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1" and "HF_TOKEN" not in env
        assert imported.site["model_revision"] == "3f1a2b4c5d6e7f8091a2b3c4d5e6f708192a3b4c"
        assert imported.site["lane_ready_timeout"] == "2400"  # port 1200 + health 600 + first token 600
        assert imported.lane.container.shm_size == "20g" and imported.lane.warmup[0].name == "readiness"
    assert pair.lane.nccl_env == {"NCCL_IB_MERGE_NICS": "1"}
    assert quad.lane.nccl_env == {"NCCL_IB_MERGE_NICS": "1", "NCCL_NVLS_ENABLE": "0"}
    ray = import_recipe(str(CORPUS / "sparkrun" / "gpt-oss-ray-generated.yaml"))[0]
    args, _ = rank0(ray, cluster_of)
    assert ray.lane.launch == "ray" and flag(args, "--distributed-executor-backend") == "ray"
    assert flag(args, "--max-num-seqs") == "4" and flag(args, "--trust-remote-code") is True
    assert "defaults.reasoning_parser -> unused (no command: sparkrun renders only its flag map's keys)" in ray.notes


def test_sparkrun_hooks_and_executors_are_refused_by_name(tmp_path):
    hooks = str(CORPUS / "sparkrun" / "eugr-builder-hooks.yaml")
    with pytest.raises(LaneError, match=r"line 18, key 'pre_exec': runs commands in every container"):
        import_recipe(hooks)
    with pytest.raises(LaneError, match=r"key 'post_commands': runs arbitrary commands on the controller"):
        import_recipe(hooks, drop=("pre_exec", "post_exec"))
    imported = import_recipe(hooks, drop=("pre_exec", "post_exec", "post_commands", "stop_after_post",
                                          "runtime_config"))[0]
    assert any(n.startswith("post_commands -> DROPPED (--drop): runs arbitrary commands") for n in imported.notes)
    assert imported.image["repository"] == "https://github.com/eugr/spark-vllm-docker"
    assert imported.image["ref"] == "main" and "--apply-vllm-pr" in imported.image["script"]
    text = (CORPUS / "sparkrun" / "gpt-oss-ray-generated.yaml").read_text()
    for change, key, message in (
        ("runtime: vllm-ray", "runtime: sglang", "sglang: sparkinfra serves with vLLM"),
        ("runtime: vllm-ray", "runtime: vllm-ray\nexecutor: k8s", "k8s: an executor sparkinfra does not drive"),
    ):
        path = tmp_path / "x.yaml"
        path.write_text(text.replace(change, key))
        with pytest.raises(LaneError, match=message):
            import_recipe(str(path))


def test_pulse_fields(cluster_of):
    imported = import_recipe(str(CORPUS / "pulse" / "qwen-engines.yaml"))[0]
    args, env = rank0(imported, cluster_of)
    assert imported.lane.launch == "mp" and imported.lane.image == "vllm-node"
    assert flag(args, "--tensor-parallel-size") == "2" and flag(args, "--max-num-batched-tokens") == "16384"
    assert flag(args, "--reasoning-parser") == "qwen3" and flag(args, "--enable-prefix-caching") is True
    assert flag(args, "--distributed-executor-backend") is False  # spark-pulse runs without Ray
    assert env["VLLM_HOST_IP"] == "192.168.192.1" and "HUGGING_FACE_HUB_TOKEN" not in env
    command = import_recipe(str(CORPUS / "pulse" / "command.yaml"))[0]
    args, _ = rank0(command, cluster_of)
    assert flag(args, "--compilation-config") == '{"cudagraph_mode":"PIECEWISE"}'
    assert flag(args, "--quantization") == "mxfp4" and command.lane.nodes == 1


def test_a_forks_recipe_with_token_group_and_build_args(checkout, cluster_of):
    """Done-when: $HF_TOKEN -> hf_token_env, the mod group expanded, the image recipe with the ref and PR."""
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    imported = import_recipe(str(checkout / "m3-group-pr.yaml"), repo=str(checkout))[0]
    lane, image = imported.lane, imported.image
    assert lane.mods == ["fix-routing", "b12x-kernels", "eagle3-loader"] and lane.mods_from == "image"
    assert lane.image.recipe == "m3-group-pr" and "HF_TOKEN" not in lane.env
    assert "hf_token_env" not in imported.site  # the default variable: no --data line
    assert any(n.startswith("env.HF_TOKEN -> the site's hf_token_env") for n in imported.notes)
    assert image["repository"] == "https://github.com/someone/spark-vllm-docker" and image["commit"] == commit
    assert image["script"] == ["./build-and-copy.sh", "-t", "vllm-node-m3-group", "--vllm-ref",
                               "979b56a66c969ab67655d2155ab4c6c5bed15f65", "--apply-vllm-pr", "45381", "--tf5"]
    args, env = rank0(imported, cluster_of)
    assert flag(args, "--kv-cache-dtype") == "nvfp4" and flag(args, "--max-model-len") == "196608"
    assert flag(args, "--gpu-memory-utilization") == "0.929" and env["VLLM_HOST_IP"] == "192.168.192.1"
    assert lane.nccl_env == {"NCCL_CUMEM_ENABLE": "0"}
    own = checkout / "own.yaml"
    own.write_text((checkout / "m3-group-pr.yaml").read_text().replace("$HF_TOKEN", "${MY_HF}"))
    assert import_recipe(str(own), repo=str(checkout))[0].site["hf_token_env"] == "MY_HF"


def test_a_url_import_records_the_ref_and_fetches_nothing_else(monkeypatch):
    body = (CORPUS / "eugr" / "m3-group-pr.yaml").read_bytes()
    asked = []

    def opener(url, timeout):
        asked.append(url)
        return io.BytesIO(body)

    monkeypatch.setattr("urllib.request.urlopen", opener)
    url = "https://github.com/someone/spark-vllm-docker/blob/minimax-m3/recipes/m3-group-pr.yaml"
    imported = import_recipe(url)[0]
    assert asked == ["https://raw.githubusercontent.com/someone/spark-vllm-docker/minimax-m3/recipes/m3-group-pr.yaml"]
    assert imported.image["ref"] == "minimax-m3" and "commit" not in imported.image  # the lock pins the branch
    assert imported.lane.mods == ["m3-stack"] and imported.lane.mods_from == "image"  # expanded at the converge
    monkeypatch.undo()
    local = import_recipe((CORPUS / "pulse" / "command.yaml").as_uri())[0]  # file:// reads the file
    assert local.lane.name == "command" and local.lane.model == "openai/gpt-oss-120b"


@pytest.mark.parametrize("fmt", ["eugr", "sparkrun"])
@pytest.mark.parametrize("name", SHIPPED)
def test_export_imports_back_to_the_same_serve_command(name, fmt, tmp_path, cluster_of):
    lane = find_lane(name)
    text = export_lane(lane, fmt)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    back = import_recipe(str(path))
    assert len(back) == 1 and recipe_format(yaml.safe_load(text)) == fmt
    again = back[0].lane.model_copy(update={"image": lane.image})
    cluster = cluster_of(lane)
    for node in cluster.nodes:
        want, got = launch(lane, cluster, node.rank), launch(again, cluster, node.rank)
        assert got.serve_args == want.serve_args
        nccl = {k: v for k, v in lane.nccl_env.items() if v is not None}
        assert {**got.env, **again.nccl_env} == {**want.env, **nccl}
    for key, value in lane.nccl_env.items():
        assert value is not None or key in text  # a removal no recipe can say: named in the header
