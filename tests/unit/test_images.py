"""
Image recipes (``sparkinfra.lanes.images``): the bed's and the seeds' recipes load, their digest moves
with every setting and file and nothing else, a bad recipe is refused naming the file, key and line,
the head's build script (``scripts/image_build.sh``) builds both kinds against stand-in ``docker``,
and ``image_built`` yields nothing when the tag is there.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, FunctionCommand, OperationError
from pyinfra.context import ctx_host, ctx_state

from sparkinfra import lanes, scripts
from sparkinfra.lanes import images
from sparkinfra.operations.stage import image_built, image_on_workers, image_present

from test_lane_plan import _sim_cluster
from test_operations import FakeHost, rendered
from test_stage import stubs

REPO = Path(__file__).resolve().parents[2]


def shown_command(command):
    """The command ``progress.shown`` wraps (its output printed as it comes): it must be one."""
    assert isinstance(command, FunctionCommand) and command.function.__name__.startswith("shown("), command
    return command.command
BED = REPO / "images/sparkbed-lane"


def _recipe(tmp_path: Path, text: str, **files: str) -> Path:
    folder = tmp_path / "images" / "r"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(text)
    for name, body in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(body)
    return folder


def test_the_sim_lanes_run_the_beds_recipe_built_on_the_beds_base_image():
    bed_image = ast.literal_eval(
        next(line.split("=", 1)[1] for line in (REPO / "group_data/bed.py").read_text().splitlines()
             if line.startswith("image ="))
    )
    recipe = images.load_recipe(BED)
    assert recipe.base == bed_image and recipe.dockerfile == "Dockerfile"
    for name in ("sim", "sim-b", "sim-long"):
        image = lanes.lane_image(lanes.find_lane(name), "unused")
        assert image.ref == f"sparkinfra/sparkbed-lane:{images.recipe_digest(BED, recipe)}"
        assert image.recipe == recipe and image.folder == BED
    assert "ARG BASE_IMAGE" in (BED / "Dockerfile").read_text()
    assert images.build_command_args(image) == ["dockerfile", "Dockerfile", "BASE_IMAGE=sparkbed/stage:1"]


def test_a_lane_without_a_recipe_runs_its_reference_or_the_clusters_image():
    lane = lanes.find_lane("pair-a-balanced").model_copy(update={"image": None})
    assert lanes.lane_image(lane, "vllm-node:latest") == images.Image("vllm-node:latest")
    tagged = lane.model_copy(update={"image": "nvcr.io/nvidia/vllm:26.01-py3"})
    assert lanes.lane_image(tagged, "x").ref == "nvcr.io/nvidia/vllm:26.01-py3"  # not locked yet: as named
    digest = "sha256:" + "b" * 64
    assert lanes.lane_image(tagged, "x", {"lane/pair-a-balanced/image": digest}).ref == f"nvcr.io/nvidia/vllm@{digest}"
    pinned = lane.model_copy(update={"image": "nvcr.io/nvidia/vllm@sha256:" + "a" * 64})
    assert lanes.lane_image(pinned, "vllm-node:latest").ref == pinned.image


def test_the_digest_moves_with_each_setting_file_and_mode_and_nothing_else(tmp_path):
    folder = _recipe(tmp_path, "dockerfile: Dockerfile\nbase: b:1\n", Dockerfile="FROM b\n", **{"p/a.patch": "x"})
    first = images.recipe_digest(folder, images.load_recipe(folder))
    assert images.recipe_digest(folder, images.load_recipe(folder)) == first
    assert images.recipe_tarball(folder) == images.recipe_tarball(folder)
    seen = {first}
    (folder / "p/a.patch").write_text("y")
    seen.add(images.recipe_digest(folder, images.load_recipe(folder)))
    (folder / "p/a.patch").chmod(0o755)
    seen.add(images.recipe_digest(folder, images.load_recipe(folder)))
    (folder / "recipe.yaml").write_text("dockerfile: Dockerfile\nbase: b:2\n")
    seen.add(images.recipe_digest(folder, images.load_recipe(folder)))
    (folder / "new.txt").write_text("")
    seen.add(images.recipe_digest(folder, images.load_recipe(folder)))
    assert len(seen) == 5


def test_the_tarball_holds_every_file_with_its_mode():
    with tarfile.open(fileobj=io.BytesIO(images.recipe_tarball(BED))) as tar:
        members = {m.name: m.mode for m in tar.getmembers()}
    assert set(members) == {relative for relative, _ in images.recipe_files(BED)}
    assert members["rootfs/usr/local/bin/vllm"] == 0o755 and members["Dockerfile"] == 0o644


@pytest.mark.parametrize("text, files, expected", [
    ("base: b:1\n", {}, "recipe.yaml: give either dockerfile (built here) or repository"),
    ("dockerfile: Dockerfile\nrepository: https://x/y\n", {"Dockerfile": ""}, "give either dockerfile"),
    ("dockerfile: Dockerfile\n", {}, "line 1, key 'dockerfile': no file Dockerfile in"),
    ("dockerfile: D\nwheels: [a.whl, b.whl]\n", {"D": "", "a.whl": ""}, "line 2, key 'wheels[1]': no file b.whl"),
    ("dockerfile: ../D\n", {}, "key 'dockerfile'"),
    ("dockerfile: D\nwheels: [x/../../y.whl]\n", {"D": ""},
     "key 'wheels[0]': 'x/../../y.whl': a recipe's files are in its folder"),
    ("dockerfile: D\ncommit: " + "a" * 40 + "\n", {"D": ""}, "key 'commit': only for a repository recipe"),
    ("dockerfile: D\nbuild_args: {'a b': x}\n", {"D": ""}, "key 'build_args': 'a b' is not a build argument name"),
    ("dockerfile: D\nbsae: x\n", {"D": ""}, "line 2, key 'bsae': unknown key — did you mean 'base'?"),
    ("repository: https://x/y\ncommit: main\nscript: [./b]\nproduces: i:1\n", {}, "key 'commit'"),
    ("repository: https://x/y\ncommit: " + "a" * 40 + "\n", {}, "a repository recipe needs script, produces"),
    ("repository: https://x/y\ncommit: " + "a" * 40 + "\nscript: [./b]\nproduces: i\nvllm_ref: v1\n", {},
     "key 'vllm_ref': only for a dockerfile recipe (give them to the script)"),
    ("repository: ssh://x/y\n", {}, "key 'repository'"),
    ("- a\n", {}, "an image recipe holds one mapping"),
])
def test_a_bad_recipe_is_refused_naming_the_file_key_and_line(tmp_path, text, files, expected):
    folder = _recipe(tmp_path, text, **files)
    with pytest.raises(lanes.LaneError) as err:
        images.load_recipe(folder)
    assert expected in str(err.value) and "images/r/recipe.yaml" in str(err.value)


def test_a_lane_naming_a_missing_recipe_is_refused_by_the_lane_check(tmp_path):
    (tmp_path / "lanes").mkdir()
    text = (REPO / "lanes/sim.yaml").read_text().replace("recipe: sparkbed-lane", "recipe: nope")
    (tmp_path / "lanes/sim.yaml").write_text(text)
    lane = lanes.find_lane("sim", project=tmp_path)
    problems = lanes.check_lane(lane, _sim_cluster())
    assert any("image recipe 'nope'" in p and "images/nope/recipe.yaml: no such recipe" in p for p in problems)


def test_the_seeds_recipes_load_and_leave_to_the_lock_only_what_the_network_decides():
    from sparkinfra import lock

    for folder in sorted(p.parent for p in (REPO / "images").glob("*/recipe.yaml")):
        recipe = images.load_recipe(folder)
        assert recipe.description, folder
        refs = lock.recipe_references(folder.name, recipe)
        if recipe.repository:
            assert bool(recipe.commit) != any(r.name == f"recipe/{folder.name}" for r in refs), folder
        if recipe.base and "@sha256:" not in recipe.base and folder != BED:
            assert f"recipe/{folder.name}/base" in [r.name for r in refs], f"{folder}: a pulled base is locked by digest"


# The head's build script, against a stand-in docker that records its arguments and makes images
# as files.
DOCKER = """
log={log}
echo "docker $*" >> "$log"
case "$1" in
  build) tag=$3; touch "{images}/$(echo "$tag" | tr / _)";;
  tag) [ -e "{images}/$(echo "$2" | tr / _)" ] && touch "{images}/$(echo "$3" | tr / _)";;
  image) [ -e "{images}/$(echo "$3" | tr / _)" ];;
esac
"""


def _build(tmp_path: Path, folder: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "images-made").mkdir(exist_ok=True)
    log = tmp_path / "docker.log"
    env = stubs(tmp_path, docker=DOCKER.format(log=log, images=tmp_path / "images-made"))
    tarball = tmp_path / "recipe.tar"
    tarball.write_bytes(images.recipe_tarball(folder))
    node = tmp_path / "node"
    proc = subprocess.run(
        ["sh", str(scripts.path("image_build.sh")), "sparkinfra/r:abc", str(node), str(tarball), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )
    return proc, log.read_text() if log.exists() else ""


def test_a_dockerfile_recipe_is_built_from_its_files_with_its_build_args(tmp_path):
    folder = _recipe(tmp_path, "dockerfile: D\nbase: b:1\nvllm_prs: [1, 2]\nbuild_args: {X: 'a b'}\n", D="FROM b\n")
    recipe = images.load_recipe(folder)
    with pytest.raises(ValueError, match=r"vllm_prs \[1, 2\] are not locked"):
        images.build_command_args(images.Image("sparkinfra/r:abc", recipe, "r", folder))
    pins = {"recipe/r/pr-1": "1" * 40, "recipe/r/pr-2": "2" * 40, "recipe/r/base": "sha256:" + "b" * 64}
    image = images.Image("sparkinfra/r:abc", images.pinned(recipe, "r", pins), "r", folder)
    args = images.build_command_args(image)
    assert args == ["dockerfile", "D", f"BASE_IMAGE=b@sha256:{'b' * 64}", "VLLM_PRS=1 2",
                    f"VLLM_PR_COMMITS={'1' * 40} {'2' * 40}", "VLLM_REPOSITORY=https://github.com/vllm-project/vllm.git",
                    "X=a b"]
    proc, log = _build(tmp_path, folder, *args)
    assert proc.returncode == 0, proc.stderr
    node = tmp_path / "node"
    assert log.splitlines() == [
        f"docker build --tag sparkinfra/r:abc --file {node}/files/D --build-arg BASE_IMAGE=b@sha256:{'b' * 64} "
        f"--build-arg VLLM_PRS=1 2 --build-arg VLLM_PR_COMMITS={'1' * 40} {'2' * 40} "
        f"--build-arg VLLM_REPOSITORY=https://github.com/vllm-project/vllm.git --build-arg X=a b {node}/files"
    ]
    assert (node / "files/D").read_text() == "FROM b\n" and not (tmp_path / "recipe.tar").exists()


# A build's progress: its output goes to the log, the screen gets one line a period at most, naming
# the step it is at (stand-in docker builds printing BuildKit's plain lines, slowly).
SLOW_BUILD = """
[ "$1" = build ] || exit 2
echo '#1 [internal] load build definition from D'
sleep 1.3
echo '#5 [2/3] RUN make'
i=0; while [ $i -lt 200 ]; do echo "#5 0.$i compiling part $i"; i=$((i + 1)); done
sleep 2.6
echo '#6 [3/3] COPY out /'
sleep 1.3
{fail}
"""
STEP = r"build sparkinfra/r:abc: (\d+) s(?:, (.+))?"


def _slow_build(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[tuple[float, str]], float]:
    """The build of a dockerfile recipe against ``SLOW_BUILD``, PROGRESS_EVERY=1: (process, (time, line) of
    each line of its stdout, seconds it took)."""
    folder = _recipe(tmp_path, "dockerfile: D\n", D="FROM b\n")
    tarball = tmp_path / "recipe.tar"
    tarball.write_bytes(images.recipe_tarball(folder))
    env = {**stubs(tmp_path, docker=SLOW_BUILD.format(fail=fail)), "PROGRESS_EVERY": "1"}
    began = time.monotonic()
    proc = subprocess.Popen(
        ["sh", "-c", scripts.text("image_build.sh"), "image_build.sh", "sparkinfra/r:abc", str(tmp_path / "node"),
         str(tarball), "dockerfile", "D"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [(time.monotonic() - began, line.rstrip("\n")) for line in proc.stdout]
    proc.stderr_text = proc.stderr.read()
    proc.wait(timeout=30)
    return proc, lines, time.monotonic() - began


def test_a_build_shows_its_step_at_most_once_a_period_and_its_time(tmp_path):
    proc, lines, took = _slow_build(tmp_path)
    assert proc.returncode == 0, proc.stderr_text
    *progress, (_, last) = lines
    assert re.fullmatch(r"build sparkinfra/r:abc: built in (\d+) s", last) and 3 <= int(last.split()[-2]) <= took + 1
    steps = [re.fullmatch(STEP, line) for _, line in progress]
    assert all(steps), progress
    assert len(progress) <= took + 1 and all(b - a > 0.5 for (a, _), (b, _) in zip(progress, progress[1:])), progress
    named = [m[2] for m in steps]
    assert "[2/3] RUN make" in named and named[-1] == "[3/3] COPY out /", named
    assert named == sorted(set(named), key=named.index), "a step repeated within six periods"  # [2/3]: 2.6 s
    assert not any("compiling" in line for _, line in lines)  # the build's own output stays in the log
    assert "#5 0.199 compiling part 199" in (tmp_path / "node/build.log").read_text()


def test_a_failed_build_shows_the_end_of_its_log(tmp_path):
    proc, lines, _ = _slow_build(tmp_path, fail="echo 'ERROR: failed to solve: exit code: 2' >&2; exit 1")
    assert proc.returncode == 1
    err = proc.stderr_text.splitlines()
    assert err[-2] == "ERROR: failed to solve: exit code: 2" and len(err) == 41, err
    assert err[0] == "#5 0.162 compiling part 162"  # the log's last 40 lines, then what failed
    assert err[-1] == (f"image_build sparkinfra/r:abc: docker build failed (the last lines of its log are above, "
                       f"all of it is in {tmp_path}/node/build.log)")
    assert not any("built in" in line for _, line in lines)


@pytest.fixture
def build_repo(tmp_path):
    """A local git repository with a build script that makes the image ``made:1``."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    repo = tmp_path / "upstream"
    repo.mkdir()
    (repo / "build.sh").write_text('#!/bin/sh\necho "built $(cat version) with $*"\ndocker build -t made:1 .\n')
    (repo / "build.sh").chmod(0o755)
    (repo / "version").write_text("v1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "version").write_text("v2 (not the pinned commit)\n")
    subprocess.run([*git, "commit", "-q", "-am", "two"], check=True)
    return repo, commit


def test_a_repository_recipe_builds_the_pinned_commit_patched_by_its_script(tmp_path, build_repo):
    repo, commit = build_repo
    patch = "--- a/version\n+++ b/version\n@@ -1 +1 @@\n-v1\n+v1-patched\n"
    text = f"repository: file://{repo}\ncommit: {commit}\npatches: [fix.patch]\nscript: [./build.sh, --x]\nproduces: made:1\n"
    folder = _recipe(tmp_path, text, **{"fix.patch": patch})
    image = images.Image("sparkinfra/r:abc", images.load_recipe(folder), "r", folder)
    args = images.build_command_args(image)
    assert args == ["repository", f"file://{repo}", commit, "made:1", "1", "fix.patch", "./build.sh", "--x"]
    proc, log = _build(tmp_path, folder, *args)
    assert proc.returncode == 0, proc.stderr
    build_log = tmp_path / "node/build.log"  # the script's output, kept; not on the screen
    assert "built v1-patched with --x" in build_log.read_text() and "built v1" not in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("build sparkinfra/r:abc: built in ")
    assert log.splitlines()[-1] == "docker tag made:1 sparkinfra/r:abc"
    # Again: the checkout is reused (no fetch), reset to the commit and patched once more.
    proc, _ = _build(tmp_path, folder, *args)
    assert proc.returncode == 0 and "built v1-patched with --x" in build_log.read_text(), proc.stderr


def test_a_repository_fetch_shows_gits_progress(tmp_path, build_repo):
    """A fetch of a large repository takes minutes: git's own progress (\\r-separated) names the step."""
    repo, commit = build_repo
    real = shutil.which("git")
    slow_git = (f'if [ "$1" = fetch ]; then for p in 10 40 80; do printf "Receiving objects:  $p%% ($p/100), 1.00 MiB | '
                f'2.00 MiB/s\\r" >&2; sleep 0.6; done; fi\nexec {real} "$@"\n')
    text = f"repository: file://{repo}\ncommit: {commit}\nscript: [./build.sh]\nproduces: made:1\n"
    folder = _recipe(tmp_path, text)
    tarball = tmp_path / "recipe.tar"
    tarball.write_bytes(images.recipe_tarball(folder))
    (tmp_path / "images-made").mkdir()
    env = {**stubs(tmp_path, git=slow_git, docker=DOCKER.format(log=tmp_path / "docker.log", images=tmp_path / "images-made")),
           "PROGRESS_EVERY": "0.5"}
    args = images.build_command_args(images.Image("sparkinfra/r:abc", images.load_recipe(folder), "r", folder))
    proc = subprocess.run(["sh", "-c", scripts.text("image_build.sh"), "image_build.sh", "sparkinfra/r:abc",
                           str(tmp_path / "node"), str(tarball), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    fetching = [m[1] for line in proc.stdout.splitlines()
                if (m := re.fullmatch(r"build sparkinfra/r:abc: \d+ s, Receiving objects: +(\d+)% .*", line))]
    assert fetching and fetching == sorted(fetching, key=int), proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("build sparkinfra/r:abc: built in "), proc.stdout


@pytest.mark.parametrize("fault, expected", [
    ("patch", "patch fix.patch does not apply to"),
    ("produces", "the build script made no image other:1"),
    ("commit", "file://"),
])
def test_a_failed_repository_build_names_its_step(tmp_path, build_repo, fault, expected):
    repo, commit = build_repo
    patch = "--- a/version\n+++ b/version\n@@ -1 +1 @@\n-not there\n+x\n" if fault == "patch" else ""
    produces = "other:1" if fault == "produces" else "made:1"
    commit = "b" * 40 if fault == "commit" else commit
    folder = _recipe(tmp_path, "x: 1\n", **{"fix.patch": patch})
    proc, _ = _build(tmp_path, folder, "repository", f"file://{repo}", commit, produces,
                     *(["1", "fix.patch"] if patch else ["0"]), "./build.sh")
    assert proc.returncode != 0 and f"image_build sparkinfra/r:abc: {expected}" in proc.stderr, proc.stderr


def test_image_built_builds_only_a_missing_tag():
    image = lanes.lane_image(lanes.find_lane("sim"), "unused")
    fact = {"fact": "DockerImageId", "args": {"image": image.ref}}
    for value, built in ((f"sha256:{'1' * 64}", False), (None, True)):
        host = FakeHost("spark-1", [{**fact, "value": value}])
        with ctx_state.use(host.state), ctx_host.use(host):
            commands = list(image_built._inner(image=image))
        if not built:
            assert commands == [] and host.noops == [f"{image.ref} is built"]
            continue
        install, upload, build = commands
        assert rendered(install) == f"install -d -m 700 /run/sparkinfra {images.NODE_DIR}/sparkbed-lane"
        assert isinstance(upload, FileUploadCommand) and upload.dest == "/run/sparkinfra/recipe-sparkbed-lane.tar"
        assert upload.src.getvalue() == images.recipe_tarball(BED)
        build = shown_command(build)  # its progress lines printed as they come
        assert rendered(build).startswith("sh -c ")
        assert rendered(build).endswith(
            f"image_build.sh {image.ref} {images.NODE_DIR}/sparkbed-lane /run/sparkinfra/recipe-sparkbed-lane.tar "
            "dockerfile Dockerfile BASE_IMAGE=sparkbed/stage:1"
        )



# The image on the workers: streamed only where its ID differs, never on an error


IMAGE, HEAD_ID, OLD_ID = "vllm-node:latest", "sha256:" + "1" * 64, "sha256:" + "2" * 64


class DockerDown(FakeHost):
    """A node whose dockerd does not answer: as pyinfra does with the fact's error, it is reported
    on the node, the node fails, and the read gives the fact's default."""

    def get_fact(self, fact, *args, **kwargs):
        self.state.failed_hosts.add(self)
        return None


class Unreadable(FakeHost):
    """A node whose fact read breaks (a lost connection)."""

    def get_fact(self, fact, *args, **kwargs):
        raise ConnectionError("channel closed")


def fan_out(*workers: FakeHost, head: FakeHost | None = None) -> tuple[list[str], list[str], str]:
    """(commands, head's noops, refusal) of ``image_on_workers`` on the head, every node in one run."""
    head = head or FakeHost("spark-1", [{"fact": "DockerImageId", "args": {"image": IMAGE}, "value": HEAD_ID}])
    for w in workers:
        w.state = head.state
    with ctx_state.use(head.state), ctx_host.use(head):
        try:
            commands = list(image_on_workers._inner(
                image=IMAGE, workers=[(w, f"10.213.1.{i}") for i, w in enumerate(workers, 2)]))
        except OperationError as refusal:  # caught inside: pyinfra's ``use`` restores nothing on an error
            return [], head.noops, str(refusal)
    return [rendered(shown_command(c)) for c in commands], head.noops, ""


def worker(name: str, image_id: str | None) -> FakeHost:
    return FakeHost(name, [{"fact": "DockerImageId", "args": {"image": IMAGE}, "value": image_id}])


def test_the_image_streams_only_to_workers_whose_id_differs():
    commands, _, _ = fan_out(worker("spark-2", HEAD_ID), worker("spark-3", OLD_ID), worker("spark-4", None))
    assert len(commands) == 1
    assert commands[0].startswith("python3 -c ") and f" {IMAGE} {HEAD_ID} " in commands[0]  # image_fanout.py
    assert commands[0].endswith(" spark-3=10.213.1.3 spark-4=10.213.1.4")
    commands, noops, _ = fan_out(worker("spark-2", HEAD_ID))
    assert commands == [] and noops == [f"every worker has {IMAGE} {HEAD_ID[:19]}"]


def test_a_worker_whose_docker_could_not_be_asked_stops_the_stream_naming_it():
    commands, _, refusal = fan_out(worker("spark-2", OLD_ID), DockerDown("spark-3", []))
    assert commands == []
    assert refusal == (
        f"the ID of image {IMAGE} could not be read on spark-3 (failed in this run, its error is above): "
        "nothing was loaded, built or streamed"
    )


def test_a_worker_that_failed_earlier_in_the_run_gets_nothing():
    failed = worker("spark-2", OLD_ID)
    head = FakeHost("spark-1", [{"fact": "DockerImageId", "args": {"image": IMAGE}, "value": HEAD_ID}])
    head.state.failed_hosts.add(failed)
    commands, _, refusal = fan_out(failed, head=head)
    assert commands == [] and "could not be read on spark-2 (failed in this run" in refusal


def test_a_worker_whose_read_breaks_stops_the_stream_naming_it_and_the_error():
    commands, _, refusal = fan_out(worker("spark-2", OLD_ID), Unreadable("spark-3", []))
    assert commands == [] and "could not be read on spark-3 (ConnectionError: channel closed)" in refusal


def test_a_head_whose_docker_could_not_be_asked_loads_nothing():
    head = DockerDown("spark-1", [])
    with ctx_state.use(head.state), ctx_host.use(head), pytest.raises(OperationError, match="on spark-1 "):
        list(image_present._inner(image=IMAGE, tarball="/srv/vllm-node.tar"))


def test_a_lanes_image_is_hashed_once_per_run_and_again_when_a_file_changes(tmp_path):
    (tmp_path / "lanes").mkdir()
    (tmp_path / "lanes/sim.yaml").write_text((REPO / "lanes/sim.yaml").read_text().replace("sparkbed-lane", "r"))
    folder = _recipe(tmp_path, "dockerfile: D\n", D="FROM b\n")
    lane = lanes.find_lane("sim", project=tmp_path)
    first = lanes.lane_image(lane, "unused")
    hits = images._recipe_image.cache_info().hits
    assert lanes.lane_image(lane, "unused") == first  # every rank's plan asks: one read, one hash
    assert images._recipe_image.cache_info().hits == hits + 1
    (folder / "wheel.whl").write_text("new")
    assert lanes.lane_image(lane, "unused").ref != first.ref
