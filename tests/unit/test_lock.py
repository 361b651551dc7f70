"""
The site's lock (``sparkinfra.lock``): references resolved by ``node/pin_resolve.py`` against
real servers on 127.0.0.1 (the bed's hub stand-in, a git repository, a package index page), the
lock file's form and refusals, the settings as it pins them, and its command line from zero, again
(nothing resolved), after the Hub moved a branch (still the locked commit), and with ``--update``.
"""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from contextlib import chdir
from pathlib import Path

import pytest

from sparkbed import hub
from sparkinfra import lock
from sparkinfra.cli.lock import main as lock_main
from sparkinfra.lanes import images
from spark_cluster import load_cluster

SHA = "a" * 40
MOVED = "b" * 40
WHEEL = "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl"
WHEEL_SHA = "c" * 64


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture
def hub_url(tmp_path):
    """The bed's hub serving org/model with ``main`` at SHA (``MOVED`` exists too)."""
    root = tmp_path / "hub"
    for sha in (SHA, MOVED):
        (root / "org/model" / sha).mkdir(parents=True)
        (root / "org/model" / sha / "config.json").write_text(f'{{"rev": "{sha[:4]}"}}\n')
    (root / "org/model/refs").mkdir()
    (root / "org/model/refs/main").write_text(SHA + "\n")
    server = hub.serve(root, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


@pytest.fixture
def repo(tmp_path):
    """A build repository: main (two commits), an annotated tag v1, a pull request's head ref, mods."""
    path = tmp_path / "upstream"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "mods/one").mkdir(parents=True)
    (path / "mods/one/run.sh").write_text("echo one\n")
    (path / "mods/two").mkdir()
    (path / "mods/two/run.sh").write_text("echo two\n")
    (path / "mods/both").mkdir()
    (path / "mods/both/mod-group.yaml").write_text("description: one then two\nmods: [one, two]\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "first")
    first = git(path, "rev-parse", "HEAD")
    git(path, "tag", "-a", "v1", "-m", "v1")
    (path / "mods/two/run.sh").write_text("echo two again\n")
    git(path, "commit", "-q", "-am", "second")
    git(path, "update-ref", "refs/pull/7/head", first)
    return path, first, git(path, "rev-parse", "HEAD")


@pytest.fixture
def index_url(tmp_path):
    page = tmp_path / "index/simple/nvidia-nccl-cu13/index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../files/{WHEEL}#sha256={WHEEL_SHA}">{WHEEL}</a>\n')
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(tmp_path / "index")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_resolver_pins_each_kind_where_the_network_is(hub_url, repo, index_url):
    url, _ = hub_url
    path, first, head = repo
    refs = [
        lock.Reference("model", "hub", "org/model", "main", (("endpoint", url),)),
        lock.Reference("recipe/r", "git", f"file://{path}", "main"),
        lock.Reference("recipe/r/vllm", "git", f"file://{path}", "v1"),
        lock.Reference("recipe/r/pr-7", "git", f"file://{path}", "refs/pull/7/head"),
        lock.Reference("nccl", "wheel", index_url, "2.30.7", (("project", "nvidia-nccl-cu13"), ("machine", "aarch64"))),
    ]
    made, failed = lock.resolve_here(refs)
    assert failed == []
    assert {name: entry.pin for name, entry in made.items()} == {
        "model": SHA, "recipe/r": head, "recipe/r/vllm": first, "recipe/r/pr-7": first, "nccl": WHEEL_SHA}
    assert made["model"].ref == "main" and made["model"].source == "org/model"


def test_what_cannot_be_resolved_is_named_with_why(hub_url, repo):
    url, _ = hub_url
    path, _, _ = repo
    refs = [
        lock.Reference("model", "hub", "org/model", "nope", (("endpoint", url),)),
        lock.Reference("drafter", "hub", "org/other", "main", (("endpoint", url),)),
        lock.Reference("recipe/r", "git", f"file://{path}", "gone"),
        lock.Reference("recipe/s", "git", "file:///nonexistent/repo", "main"),
    ]
    made, failed = lock.resolve_here(refs)
    assert made == {}
    said = "\n".join(failed)
    assert "model (org/model@nope): " in said and "RevisionNotFound" in said
    assert "drafter (org/other@main): " in said and "RepoNotFound" in said
    assert "has no branch, tag or ref 'gone'" in said
    assert "recipe/s (file:///nonexistent/repo@main): git ls-remote" in said


def test_a_refused_token_is_named_by_its_variable(tmp_path):
    """The Hub's 401 for a token it refuses: where the token came from (hf_token_env). A gated model's
    info stays public, as on the Hub, so no token resolves (its download names the variable then);
    a private repository's 401 without one names the variable to export. A git reference's refusal
    gets no such hint."""
    root = tmp_path / "gated"
    (root / "org/model" / SHA).mkdir(parents=True)
    (root / "org/model" / SHA / "config.json").write_text("{}\n")
    (root / "org/model/refs").mkdir()
    (root / "org/model/refs/main").write_text(SHA + "\n")
    server = hub.serve(root, "127.0.0.1", 0, token="hf_right_token_123")
    try:
        ref = lock.Reference("model", "hub", "org/model", "main", (("endpoint", f"http://127.0.0.1:{server.server_address[1]}"),))
        made, failed = lock.resolve_here([ref])
        assert failed == [] and made["model"].pin == SHA
        _, failed = lock.resolve_here([ref], "hf_wrong_token_987")
        (wrong,) = lock.token_hints(failed, "SITE_HF_TOKEN", "hf_wrong_token_987")
        assert ": HTTP 401" in wrong and wrong.endswith(
            "(sent the token from SITE_HF_TOKEN: the Hub refuses it, or the model is gated and that account has not "
            "accepted its terms)"), wrong
        assert "hf_wrong_token_987" not in wrong
    finally:
        server.shutdown()
        server.server_close()
    private = "model (org/private@main): GET https://huggingface.co/api/models/org/private/revision/main: HTTP 401 Unauthorized"
    assert lock.token_hints([private], "HF_TOKEN", "") == [
        private + " (sent no token: HF_TOKEN (hf_token_env) is unset or empty in this shell; export it)"]
    git_refusal = "recipe/r (https://github.com/x/y@main): git ls-remote: HTTP 403"
    assert lock.token_hints([git_refusal], "HF_TOKEN", "") == [git_refusal]


def _entry(pin: str = SHA) -> dict:
    return {"source": "org/model", "ref": "main", "pin": pin, "resolved": "2026-12-06T00:00:00Z on bluey (x)"}


@pytest.mark.parametrize("text, said", [
    ("modle: {source: a/b, ref: main, pin: '%s', resolved: x}\n" % SHA, "entry 'modle': not an entry a lock holds"),
    ("model: {source: a/b, ref: main, pin: '123abc', resolved: x}\n", "pin '123abc' is not a commit (40 hex)"),
    ("nccl: {source: i, ref: '2', pin: '%s', resolved: x}\n" % SHA, "is not a sha256 (64 hex)"),
    ("recipe/r/base: {source: i, ref: '2', pin: 'latest', resolved: x}\n", "is not an image digest"),
    ("model: {source: a/b, ref: main, pin: '%s'}\n" % SHA, "needs exactly source, ref, pin, resolved"),
    ("- model\n", "a lock holds one mapping of entries"),
])
def test_a_lock_edited_by_hand_is_refused_naming_file_entry_and_line(tmp_path, text, said):
    path = tmp_path / "pair.lock.yaml"
    path.write_text("# a comment\n" + text)
    with pytest.raises(lock.LockError) as exc:
        lock.read(path)
    assert said in str(exc.value) and "pair.lock.yaml" in str(exc.value)
    if "entry" in said:
        assert ":2: entry" in str(exc.value)


def test_the_lock_file_round_trips_sorted_and_commented(tmp_path):
    path = tmp_path / "pair.lock.yaml"
    entries = {"model": lock.Entry(**_entry()), "drafter": lock.Entry(**{**_entry(), "source": "org/draft"})}
    diff = lock.write(path, "pair", entries)
    assert lock.read(path) == entries
    text = path.read_text()
    assert text.startswith("# The lock of cluster pair") and text.index("drafter:") < text.index("model:")
    assert "+model:" in diff and lock.write(path, "pair", entries) == ""


def test_the_settings_as_the_lock_pins_them(tmp_path):
    cluster = load_cluster(tmp_path, {"model": "org/model", "model_revision": "main", "drafter": "org/draft",
                                      "drafter_revision": "v2", "nccl_version": "2.30.7"})
    refs = lock.references(cluster)
    assert [(r.name, r.kind, r.source, r.ref) for r in refs] == [
        ("model", "hub", "org/model", "main"), ("drafter", "hub", "org/draft", "v2"),
        ("nccl", "wheel", "https://pypi.org/simple", "2.30.7")]
    entries = {"model": lock.Entry(**_entry()),
               "drafter": lock.Entry("org/draft", "v1", MOVED, "x")}  # locked for another ref: not a pin now
    assert [r.name for r in lock.missing(refs, entries)] == ["drafter", "nccl"]
    assert [r.name for r in lock.missing(refs, entries, {"model"})] == ["model", "drafter", "nccl"]
    pinned = lock.apply(cluster, lock.pins(refs, entries))
    assert pinned.config.model_revision == SHA and pinned.config.drafter_revision == "v2"
    assert pinned.pin("model") == SHA and pinned.pin("drafter") is None
    commit = load_cluster(tmp_path, {"model": "org/model", "model_revision": SHA, "nccl_wheel": ""})
    assert lock.references(commit) == []  # a commit and no fetched wheel: nothing left to the network


def test_a_recipes_references_and_its_pinned_build(tmp_path):
    recipe = images.Recipe(dockerfile="Dockerfile", base="nvcr.io/nvidia/vllm:26.01-py3", vllm_ref="main",
                           vllm_prs=[45744])
    refs = lock.recipe_references("r", recipe, site_image="vllm-node:latest")
    assert [(r.name, r.kind, r.source, r.ref) for r in refs] == [
        ("recipe/r/base", "image", "nvcr.io/nvidia/vllm", "26.01-py3"),
        ("recipe/r/vllm", "git", "https://github.com/vllm-project/vllm.git", "main"),
        ("recipe/r/pr-45744", "git", "https://github.com/vllm-project/vllm.git", "refs/pull/45744/head")]
    assert lock.recipe_references("r", recipe.model_copy(update={"base": "vllm-node:latest"}), "vllm-node:latest")[0].name \
        == "recipe/r/vllm"  # the site's own image is the site's, not the network's
    pins = {"recipe/r/base": "sha256:" + "d" * 64, "recipe/r/vllm": MOVED, "recipe/r/pr-45744": SHA}
    built = images.pinned(recipe, "r", pins)
    assert built.base == "nvcr.io/nvidia/vllm@sha256:" + "d" * 64 and built.vllm_ref == MOVED
    assert built.pr_commits == [SHA]
    repository = images.Recipe(repository="https://example.invalid/x.git", ref="minimax", script=["./b"], produces="x:1")
    assert lock.recipe_references("s", repository)[0].ref == "minimax"
    assert images.pinned(repository, "s", {"recipe/s": SHA}).commit == SHA


def _project(tmp_path: Path, url: str, extra: str = "") -> Path:
    project = tmp_path / "site"
    (project / "inventory").mkdir(parents=True)
    (project / "group_data").mkdir()
    (project / "inventory/pair.py").write_text(
        "pair = [('bluey', {'rank': 0, 'fabric_ip': '192.168.192.1'}), ('reddie', {'rank': 1, 'fabric_ip': '192.168.192.2'})]\n")
    (project / "group_data/pair.py").write_text(
        "cluster = 'pair'\nfabric_subnet = '192.168.192.0/24'\nmodel = 'org/model'\nmodel_revision = 'main'\n"
        f"nccl_wheel = ''\nhf_endpoint = {url!r}\n" + extra)
    return project


def test_the_command_line_locks_once_then_keeps_the_pin_until_updated(hub_url, tmp_path, capsys):
    url, root = hub_url
    project = _project(tmp_path, url)
    path = project / "group_data/pair.lock.yaml"
    with chdir(project):
        assert lock_main(["inventory/pair.py"]) == 0
        out = capsys.readouterr().out
        assert f"pair: pinned model: org/model main -> {SHA}" in out and "+model:" in out
        assert lock.read(path)["model"].pin == SHA
        assert lock_main(["inventory/pair.py"]) == 0
        assert "pins every reference (1); nothing resolved" in capsys.readouterr().out
        (root / "org/model/refs/main").write_text(MOVED + "\n")  # the Hub moves main
        assert lock_main(["inventory/pair.py"]) == 0  # the lock holds
        assert lock.read(path)["model"].pin == SHA
        from sparkinfra.run import load_files
        _, settings = load_files("inventory/pair.py")
        assert settings.clusters["pair"].config.model_revision == SHA  # what is staged, planned, shown
        assert lock_main(["inventory/pair.py", "--update", "model"]) == 0
        out = capsys.readouterr().out
        assert f"(was {SHA})" in out and f"-  pin: '{SHA}'" in out.replace('"', "'") or f"-  pin: {SHA}" in out
        assert lock.read(path)["model"].pin == MOVED
        assert lock_main(["inventory/pair.py", "--update", "drafter"]) == 2
        assert "--update drafter: no such reference" in capsys.readouterr().err


def test_a_malformed_lock_is_refused_before_any_connection(hub_url, tmp_path):
    url, _ = hub_url
    project = _project(tmp_path, url)
    (project / "group_data/pair.lock.yaml").write_text(
        "model: {source: org/model, ref: main, pin: 'deadbeef', resolved: x}\n")
    from sparkinfra.run import InventorySettingsError, check_inventory
    with chdir(project), pytest.raises(InventorySettingsError) as exc:
        check_inventory("inventory/pair.py")
    assert "bad lock: group_data/pair.lock.yaml:1: entry 'model': pin 'deadbeef' is not a commit" in str(exc.value)


def test_mod_groups_expand_in_order_from_the_build_repository_at_its_commit(repo, tmp_path, monkeypatch):
    from sparkinfra.lanes import mods, schema

    path, first, head = repo
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    project = tmp_path / "proj"
    (project / "lanes").mkdir(parents=True)
    (project / "images/b").mkdir(parents=True)
    (project / "images/b/recipe.yaml").write_text(
        f"repository: file://{path}\nref: main\nscript: [./build.sh]\nproduces: made:1\n")
    lane_file = project / "lanes/l.yaml"
    lane_file.write_text("name: l\nmodel: org/model\nnodes: 2\ntensor_parallel: 2\ngpu_memory_utilization: 0.5\n"
                         "image: {recipe: b}\nmods_from: image\nmods: [both]\n")
    lane = schema.load_lane(lane_file)
    with pytest.raises(mods.ModsNotFetched, match="does not pin yet"):
        mods.lane_mods(lane)
    with pytest.raises(mods.ModsNotFetched, match="not fetched on this controller yet"):
        mods.lane_mods(lane, {"recipe/b": first})
    found = mods.lane_mods(lane, {"recipe/b": first}, fetch=True)
    assert [m.name for m in found] == ["one", "two"]
    assert (found[1].folder / "run.sh").read_text() == "echo two\n"  # the locked commit's, not main's
    again = mods.lane_mods(lane.model_copy(update={"mods": ["two"]}), {"recipe/b": head}, fetch=True)
    assert (again[0].folder / "run.sh").read_text() == "echo two again\n"
    twice = lane.model_copy(update={"mods": ["both", "one"]})
    with pytest.raises(schema.LaneError, match="mod 'one' is applied twice"):
        mods.lane_mods(twice, {"recipe/b": first})
    # The recipe's patches reach the mods (seed 001's patch 2 fixes a mod), and eugr's group form:
    # a name, and members as paths from the repository's root.
    (project / "images/b/fix.patch").write_text(
        "--- a/mods/one/run.sh\n+++ b/mods/one/run.sh\n@@ -1 +1 @@\n-echo one\n+echo one, patched\n")
    (project / "images/b/recipe.yaml").write_text(
        f"repository: file://{path}\nref: main\npatches: [fix.patch]\nscript: [./build.sh]\nproduces: made:1\n")
    group = lane.model_copy(update={"mods": ["eugr"]})
    with pytest.raises(mods.ModsNotFetched):  # another checkout: the patched one
        mods.lane_mods(group, {"recipe/b": first})
    patched = mods.lane_mods(lane, {"recipe/b": first}, fetch=True)
    assert (patched[0].folder / "run.sh").read_text() == "echo one, patched\n"
    (patched[0].folder.parent / "eugr").mkdir()
    (patched[0].folder.parent / "eugr/mod-group.yaml").write_text(
        "name: eugr\ndescription: >-\n  as published\nmods: [mods/two, mods/both]\n")
    with pytest.raises(schema.LaneError, match="mod 'two' is applied twice"):
        mods.lane_mods(group, {"recipe/b": first})
    (patched[0].folder.parent / "eugr/mod-group.yaml").write_text("name: eugr\nmods: [mods/one]\n")
    assert [m.name for m in mods.lane_mods(group, {"recipe/b": first})] == ["one"]
    (patched[0].folder.parent / "loop").mkdir()
    (patched[0].folder.parent / "loop/mod-group.yaml").write_text("mods: [loop]\n")
    with pytest.raises(schema.LaneError, match="loop -> loop names itself"):
        mods.lane_mods(lane.model_copy(update={"mods": ["loop"]}), {"recipe/b": first})


def test_a_run_resolves_on_each_head_what_the_lock_lacks_once(hub_url, tmp_path, monkeypatch):
    """``settle`` (``run.start``): the head resolves what the lock lacks and the lock is written; the
    next run resolves nothing; an unreachable head resolves nothing and its cluster keeps the lock's
    pins; a dry run writes nothing; what the head cannot resolve stops the run naming it."""
    from types import SimpleNamespace

    from sparkinfra.settings import Settings

    url, _ = hub_url
    project = _project(tmp_path, url)
    from sparkinfra.run import load_files
    with chdir(project):
        _, settings = load_files("inventory/pair.py", pin=False)
    asked = []

    def on_head(host, refs, token=""):  # the head's answer, as pin_resolve.py would give it
        asked.append((host.name, [r.name for r in refs]))
        return lock.resolve_here(refs, token)

    monkeypatch.setattr(lock, "resolve_on", on_head)
    heads = {"bluey": SimpleNamespace(name="bluey", connected=True)}
    state = SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name: heads[name]))
    path = project / "group_data/pair.lock.yaml"
    dry = lock.settle(state, settings, "inventory/pair.py", project, dry=True)
    assert dry.clusters["pair"].config.model_revision == SHA and not path.exists()
    pinned = lock.settle(state, settings, "inventory/pair.py", project)
    assert asked == [("bluey", ["model"])] * 2 and lock.read(path)["model"].pin == SHA
    assert pinned.clusters["pair"].lock_file == str(path) and pinned.clusters["pair"].pin("model") == SHA
    lock.settle(state, settings, "inventory/pair.py", project)
    assert len(asked) == 2  # locked: nothing asked of the head
    path.unlink()
    heads["bluey"].connected = False
    unreached = lock.settle(state, settings, "inventory/pair.py", project)
    assert len(asked) == 2 and unreached.clusters["pair"].config.model_revision == "main"
    heads["bluey"].connected = True
    moved = Settings(clusters={"pair": settings.clusters["pair"].model_copy(update={
        "config": settings.clusters["pair"].config.model_copy(update={"model_revision": "nope"})})})
    with chdir(project), pytest.raises(lock.LockError) as exc:
        lock.settle(state, moved, "inventory/pair.py", project)
    assert "pair: not locked, and bluey could not resolve: model (org/model@nope): " in str(exc.value)
    assert "python -m sparkinfra lock inventory/pair.py (then commit group_data/pair.lock.yaml)" in str(exc.value)


# A docker for the image kind: buildx's manifest when the registry answers it, else a pull and the
# image's repo digests (docker 20.10 without buildx, as the bed's).
DOCKER = """
case "$1 $2" in
"buildx imagetools") [ -n "$BUILDX" ] && [ "$4" = "nvcr.io/nvidia/vllm:26.01-py3" ] && echo '{"mediaType": "x", "digest": "sha256:%s", "size": 1}' && exit 0
    echo "docker: 'buildx' is not a docker command." >&2; exit 1 ;;
"pull -q") [ "$3" = "nvcr.io/nvidia/vllm:26.01-py3" ] && exit 0; echo "manifest unknown" >&2; exit 1 ;;
"image inspect") echo '["other/x@sha256:%s", "nvcr.io/nvidia/vllm@sha256:%s"]' ;;
esac
""" % ("1" * 64, "2" * 64, "3" * 64)  # noqa: E501 (a script's line)


@pytest.mark.parametrize("buildx, digest", [("1", "1" * 64), ("", "3" * 64)])
def test_an_image_tag_is_pinned_to_its_digest(tmp_path, monkeypatch, buildx, digest):
    from test_stage import stubs

    env = stubs(tmp_path, docker=DOCKER)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("BUILDX", buildx)
    made, failed = lock.resolve_here([lock.Reference("recipe/r/base", "image", "nvcr.io/nvidia/vllm", "26.01-py3")])
    assert failed == [] and made["recipe/r/base"].pin == f"sha256:{digest}"
    made, failed = lock.resolve_here([lock.Reference("lane/l/image", "image", "nvcr.io/nvidia/vllm", "gone")])
    assert made == {} and "docker pull nvcr.io/nvidia/vllm:gone: manifest unknown" in failed[0]
