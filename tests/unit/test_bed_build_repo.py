"""
What the bed's network decides, and how the bed moves it (``sparkbed.upstream``): the build repository
(``build.sh``, the lane recipe copied from ``images/sparkbed-lane``, three eugr-v1 mods and a mod
group) made into a scratch folder, its build script run against a stand-in ``docker``, its mods run
by the product's ``apply_mods.sh``, the greeting mod's hook against the controller's own vLLM (its
serve parser takes ``--sparkbed-greeting`` with the hook and refuses it without), ``main`` moved on
the hub's model and on the build repository as served; and the cached base's key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

import sparkbed
from sparkbed import cache, hub, upstream

ROOT = Path(__file__).resolve().parents[2]
LANE_RECIPE = ROOT / "images" / "sparkbed-lane"
APPLY_MODS = ROOT / "sparkinfra" / "node" / "apply_mods.sh"
VLLM_CHECK = ROOT / "sparkinfra" / "node" / "vllm_check.py"
VLLM_WRAPPER = LANE_RECIPE / "rootfs" / "usr" / "local" / "bin" / "vllm"
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="the bed's repositories need git")


def git(*args: str, cwd: Path | None = None, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("GIT_")}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**clean, **GIT_ENV, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The build repository, made as ``up`` makes it (into a scratch folder), and a clone of it."""
    top = tmp_path_factory.mktemp("build-repo")
    upstream.make_build_repo(top / "sparkbed-build.git")
    git("clone", "-q", str(top / "sparkbed-build.git"), str(top / "clone"))
    return top / "clone"


def files_under(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


# The repository's content
# ------------------------


def test_the_build_repository_is_a_script_the_lane_recipe_and_mods(checkout, tmp_path):
    top = checkout.parent
    head = git("rev-parse", "HEAD", cwd=checkout).strip()
    assert upstream.make_build_repo(tmp_path / "again.git") == head  # fixed author and date: the same id
    assert upstream.build_repo_head(top / "sparkbed-build.git") == head
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=checkout).strip() == upstream.BUILD_REPO_BRANCH == "main"
    modes = {line.split("\t")[1]: line.split()[0] for line in git("ls-tree", "-r", "HEAD", cwd=checkout).splitlines()}
    assert modes["build.sh"] == "100755" and modes["README.md"] == "100644"
    # lane/: images/sparkbed-lane's Dockerfile and rootfs, byte for byte, modes kept (no recipe.yaml)
    recipe = {rel: p for rel, p in files_under(LANE_RECIPE).items() if rel != "recipe.yaml"}
    lane = files_under(checkout / "lane")
    assert sorted(lane) == sorted(recipe) and "Dockerfile" in lane
    for rel, source in recipe.items():
        assert lane[rel].read_bytes() == source.read_bytes(), rel
        assert modes[f"lane/{rel}"] == ("100755" if source.stat().st_mode & 0o111 else "100644"), rel
    # mods/: the three mods (run.sh executable) and the group naming them in its own order
    mods = checkout / "mods"
    assert sorted(p.name for p in mods.iterdir()) == sorted([*upstream.BUILD_REPO_MODS, upstream.BUILD_REPO_MOD_GROUP])
    for name in upstream.BUILD_REPO_MODS:
        assert modes[f"mods/{name}/run.sh"] == "100755", name
    group = mods / upstream.BUILD_REPO_MOD_GROUP
    assert [p.name for p in group.iterdir()] == ["mod-group.yaml"]
    spec = yaml.safe_load((group / "mod-group.yaml").read_text())
    assert set(spec) == {"description", "mods"} and isinstance(spec["description"], str) and spec["description"]
    assert sorted(spec["mods"]) == sorted(upstream.BUILD_REPO_MODS) and spec["mods"] != sorted(spec["mods"])
    assert all((mods / name / "run.sh").is_file() for name in spec["mods"])
    # build.sh makes what the recipe names, from the rootfs the bed gives every node, as image_build does
    script = (checkout / "build.sh").read_text()
    assert f"tag={upstream.BUILD_REPO_PRODUCES}\n" in script and f"rootfs={cache.IMAGE_ROOTFS_IN_NODE}\n" in script
    assert "docker import -c 'ENV PYTHONPATH=/opt/hf' -" in script and "-c 'ENV PYTHONPATH=/opt/hf' -" in cache.IMAGE_BUILD


def test_the_repositorys_scripts_pass_shellcheck(checkout):
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck is not installed (make setup installs it)"
    scripts = [checkout / "build.sh", *sorted(checkout.glob("mods/*/run.sh"))]
    assert len(scripts) == 1 + len(upstream.BUILD_REPO_MODS)
    proc = subprocess.run([shellcheck, "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_build_sh_imports_the_rootfs_then_builds_the_lane_recipe_on_it(checkout, tmp_path):
    """Against a stand-in ``docker`` that logs its arguments and what it was given on stdin."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "opt/hf").mkdir(parents=True)
    (rootfs / "opt/hf/marker").write_text("the head's image rootfs\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        '#!/bin/sh\necho "$*" >> "$DOCKER_LOG"\n'
        'if [ "$1" = import ]; then tar -t >> "$DOCKER_LOG"; echo sha256:0123; fi\n')
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DOCKER_LOG": str(log)}
    proc = subprocess.run(["bash", "./build.sh", "--rootfs", str(rootfs), "--tag", "site/lane:1"], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    base = lines[0].split()[-1]
    assert lines[0] == f"import -c ENV PYTHONPATH=/opt/hf - {base}" and base.startswith("sparkbed/build-base:")
    assert "./opt/hf/marker" in lines
    assert f"build --tag site/lane:1 --build-arg BASE_IMAGE={base} --file lane/Dockerfile lane" in lines
    assert lines[-1] == f"image rm {base}"  # the lane image keeps its layers; no tag is left behind
    assert proc.stdout.splitlines()[-1] == "build.sh: built site/lane:1"
    missing = subprocess.run(["bash", "./build.sh", "--rootfs", str(tmp_path / "none")], cwd=checkout, env=env,
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "run it on a bed node" in missing.stderr


# The mods, as apply_mods.sh runs them, and the greeting flag in vLLM's parser
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hooked(checkout, tmp_path_factory) -> dict:
    """The group's mods applied by ``apply_mods.sh`` in order, their marks in a scratch folder, with a
    venv's ``python3`` first on PATH: the greeting hook lands in that venv's site folder, as in the
    image's (``/usr/local/lib/python3.11/dist-packages``); vLLM comes on PYTHONPATH, as there."""
    top = tmp_path_factory.mktemp("mods")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(top / "venv")], check=True)
    group = yaml.safe_load((checkout / "mods" / upstream.BUILD_REPO_MOD_GROUP / "mod-group.yaml").read_text())
    env = {**os.environ, "PATH": f"{top / 'venv' / 'bin'}:{os.environ['PATH']}", "SPARKBED_MOD_DIR": str(top / "marks"),
           "SPARKINFRA_MODS_WORK": str(top / "work")}
    proc = subprocess.run(["sh", str(APPLY_MODS), str(checkout / "mods"), *group["mods"], "--", "echo", "the lane"],
                          env=env, capture_output=True, text=True, timeout=60)
    return {"proc": proc, "mods": group["mods"], "marks": top / "marks", "python": top / "venv" / "bin" / "python3"}


def test_apply_mods_runs_the_groups_mods_in_order(hooked):
    proc = hooked["proc"]
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("mod ")] == [f"mod {m}: applied" for m in hooked["mods"]]
    assert lines[-1] == "the lane"
    assert (hooked["marks"] / "applied").read_text().split() == hooked["mods"]
    assert "sparkbed-stamp mod" in (hooked["marks"] / "stamp").read_text()
    assert "sparkbed-motd mod" in (hooked["marks"] / "motd").read_text()
    site = subprocess.run([str(hooked["python"]), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert sorted(p.name for p in Path(site).glob("sparkbed_greeting*")) == ["sparkbed_greeting.pth",
                                                                             "sparkbed_greeting.py"]


def test_the_greeting_mod_gives_vllm_serve_its_flag(hooked, tmp_path):
    """The controller's vLLM CPU build (0.32, the image's): ``vllm_check.py`` (the in-image validation)
    takes ``--sparkbed-greeting`` with the hook and refuses it without; ``vllm serve`` through the
    image's ``vllm`` command logs the greeting once, before it goes on (here to a missing model)."""
    tree = cache.vllm_tree()
    if tree is None:
        pytest.skip("no vLLM here (pip install -e '.[sim]')")
    model = tmp_path / "no-model"
    model.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    requests = [{"ranks": [[str(model), "--sparkbed-greeting", "hi"]]},
                {"ranks": [[str(model), f"{upstream.GREETING_FLAG}=hello there"]]},
                {"ranks": [[str(model), "--sparkbed-greeting"]]}]
    runs = {
        "with": [str(hooked["python"]), str(VLLM_CHECK)],
        "without": [sys.executable, str(VLLM_CHECK)],  # the controller's python: no hook in its site folder
        "serve": [str(hooked["python"]), str(VLLM_WRAPPER), "serve", str(model), "--sparkbed-greeting", "hello bed"],
    }
    procs = {name: subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env) for name, cmd in runs.items()}
    out = {name: proc.communicate(json.dumps(requests) if name != "serve" else "", timeout=300)
           for name, proc in procs.items()}
    with_hook = json.loads(out["with"][0].splitlines()[-1])
    assert [r["ok"] for r in with_hook] == [True, True, False], out["with"][1][-3000:]
    assert "expected one argument" in with_hook[2]["error"]
    without = json.loads(out["without"][0].splitlines()[-1])
    assert [r["ok"] for r in without] == [False, False, False], without
    assert "unrecognized arguments: --sparkbed-greeting hi" in without[0]["error"]
    served = out["serve"][0] + out["serve"][1]
    assert procs["serve"].returncode != 0  # no model: it stops, after the greeting
    assert [line for line in served.splitlines() if "sparkbed greeting" in line] == ["sparkbed greeting: hello bed"]


# Moving main, as the network does
# --------------------------------


@pytest.fixture
def hub_root(tmp_path, monkeypatch) -> Path:
    """A hub folder holding the tiny model's repository at SIM_REVISION (``fresh_upstream``'s way)."""
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(os.urandom(2 << 20))
    monkeypatch.setattr(upstream, "HUB_ROOT", tmp_path / "hub")
    monkeypatch.setattr(upstream, "build_tiny_model", lambda: model)
    upstream._fresh_hub_model()
    return tmp_path / "hub"


def test_hub_main_moves_to_new_revisions_and_back(hub_root):
    repo = hub_root / cache.SIM_MODEL
    original = cache.SIM_REVISION
    server = hub.serve(hub_root, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert hub_info(base)["sha"] == original
        moved = sparkbed.hub_move_main()
        assert len(moved) == 40 and moved != original and (repo / "refs" / "main").read_text().strip() == moved
        info = hub_info(base)
        assert info["sha"] == moved
        assert sorted(s["rfilename"] for s in info["siblings"]) == ["README.md", "config.json", "model.safetensors"]
        big = repo / moved / "model.safetensors"
        assert big.is_symlink() and big.resolve() == (repo / original / "model.safetensors").resolve()  # not copied
        again = sparkbed.hub_move_main(cache.SIM_MODEL)
        assert again not in (original, moved) and hub_info(base)["sha"] == again
        assert (repo / again / "README.md").read_text().count("\n") == 2  # one line more each time
        assert sparkbed.hub_reset_main() == original and hub_info(base)["sha"] == original
        assert hub_info(base, moved)["sha"] == moved  # a moved revision stays, as a pushed commit does
        third = sparkbed.hub_move_main()
        assert third not in (original, moved, again)
    finally:
        server.shutdown()
        server.server_close()
    upstream._fresh_hub_model()  # the next bring-up: SIM_REVISION alone, main on it
    assert sorted(p.name for p in repo.iterdir()) == sorted([original, "refs"])
    assert (repo / "refs" / "main").read_text().strip() == original
    with pytest.raises(ValueError):
        sparkbed.hub_move_main("sparkbed/none")


def hub_info(base: str, revision: str = "main") -> dict:
    with urllib.request.urlopen(f"{base}/api/models/{cache.SIM_MODEL}/revision/{revision}") as resp:
        return json.loads(resp.read())


def test_build_repository_main_moves_as_served(tmp_path, monkeypatch):
    monkeypatch.setattr(upstream, "BUILD_REPO", tmp_path / "git" / sparkbed.BUILD_REPO_NAME)
    first = upstream.make_build_repo()
    (tmp_path / "models").mkdir()
    server = hub.serve(tmp_path / "models", "127.0.0.1", 0, git=tmp_path / "git")
    url = f"http://127.0.0.1:{server.server_address[1]}/git/{sparkbed.BUILD_REPO_NAME}"
    try:
        for env in ({}, {"GIT_SMART_HTTP": "0"}):
            assert git("ls-remote", url, "main", **env).split() == [first, "refs/heads/main"]
        second = sparkbed.build_repo_commit("A new stamp", "mods/sparkbed-stamp/stamp", "stamped again\n")
        third = sparkbed.build_repo_commit("build.sh says more", "build.sh",
                                           (upstream.BUILD_REPO_FILES / "build.sh").read_text() + "# more\n")
        assert len({first, second, third}) == 3 and sparkbed.build_repo_head() == third
        for env in ({}, {"GIT_SMART_HTTP": "0"}):  # the dumb protocol's files follow every commit
            assert git("ls-remote", url, "main", **env).split() == [third, "refs/heads/main"]
        src = tmp_path / "src"
        git("init", "-q", str(src))
        git("fetch", "-q", "--depth", "1", url, second, cwd=src)  # as image_build.sh fetches a locked commit
        git("checkout", "-q", "--detach", second, cwd=src)
        assert (src / "mods/sparkbed-stamp/stamp").read_text() == "stamped again\n"
        git("fetch", "-q", "--depth", "1", url, third, cwd=src)
        git("checkout", "-q", "--detach", third, cwd=src)
        assert os.access(src / "build.sh", os.X_OK) and (src / "build.sh").read_text().endswith("# more\n")
        assert git("log", "-1", "--format=%s", cwd=src).strip() == "build.sh says more"
    finally:
        server.shutdown()
        server.server_close()


def test_the_exported_urls():
    assert sparkbed.BUILD_REPO_URL == "http://10.213.0.1:8731/git/sparkbed-build.git"
    assert sparkbed.BUILD_REPO_URL.startswith(sparkbed.HUB_URL + "/git/")
    assert sparkbed.BUILD_REPO == sparkbed.GIT_ROOT / "sparkbed-build.git" and sparkbed.GIT_ROOT.parent == sparkbed.STATE
    assert sparkbed.BUILD_REPO_PRODUCES == "sparkbed/build-lane:latest"


# The cached base: its packages are its key
# -----------------------------------------


def test_a_base_of_other_packages_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "BASE", tmp_path / "base")
    assert "git" in cache.BASE_PACKAGES.split(",")
    assert not cache.base_is_current()
    (tmp_path / "base").mkdir()
    marker = tmp_path / "base" / ".sparkbed-ready"
    marker.write_text("2026-01-01T00:00:00\n")  # an earlier bed's marker: a time only
    assert not cache.base_is_current()
    marker.write_text("2026-01-01T00:00:00\n" + cache.base_key() + "\n")
    assert cache.base_is_current()
    monkeypatch.setattr(cache, "BASE_PACKAGES", cache.BASE_PACKAGES + ",vim")
    assert not cache.base_is_current()


def test_the_nodes_git_is_stripped_from_the_image_rootfs(tmp_path):
    root = tmp_path / "rootfs"
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the rootfs's")
    (root / "usr/bin").mkdir(parents=True)
    (root / "escape").symlink_to(outside)  # an absolute link: never followed out
    for rel in ("usr/bin/git", "usr/lib/git-core/git-remote-http", "usr/bin/perl", "usr/lib/x86_64-linux-gnu/libperl.so.5.36"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / "usr/bin/git-receive-pack").symlink_to("git")
    (info / "git.list").write_text("/.\n/usr\n/usr/bin\n/usr/bin/git\n/usr/bin/git-receive-pack\n/usr/lib/git-core\n"
                                   "/usr/lib/git-core/git-remote-http\n/escape/keep\n")
    (info / "libperl5.36:amd64.list").write_text("/usr/lib/x86_64-linux-gnu/libperl.so.5.36\n")
    (info / "perl-base.list").write_text("/usr/bin/perl\n")
    removed = cache.strip_packages(root, cache.IMAGE_DROPPED_PACKAGES)
    assert sorted(removed) == ["/usr/bin/git", "/usr/bin/git-receive-pack", "/usr/lib/git-core/git-remote-http",
                               "/usr/lib/x86_64-linux-gnu/libperl.so.5.36"]
    assert (root / "usr/bin/perl").exists() and (root / "usr/lib/git-core").is_dir()  # perl-base's; folders stay
    assert (outside / "keep").exists()
