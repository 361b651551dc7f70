"""lane_known: the known good sets every node keeps, the head's promotion, and how status shows them."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest
from test_lane_ctl import _plan, _with

from sparkinfra.cli import status as status_view
from sparkinfra.node import lane_ctl, lane_io, lane_known, platform_facts


@pytest.fixture
def ctl(tmp_path, monkeypatch):
    """A head's placed lane sim in ``tmp``: plan, env file, unit and a mod; the sets under ``tmp/known``."""
    for folder in ("plans", "units", "mods/sim/hello", "marks"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "plans" / "sim.env").write_text("A=1\n")
    (tmp_path / "units" / "sparkinfra-lane-sim.service").write_text("[Unit]\n")
    (tmp_path / "mods" / "sim" / "hello" / "run.sh").write_text("echo hello\n")
    monkeypatch.setattr(lane_known, "ROOT", str(tmp_path / "known"))
    monkeypatch.setattr(lane_io, "image_id", lambda image: "sha256:" + "ab" * 32)
    ctl = type("Ctl", (), {"tmp": tmp_path})()
    plan = _plan(ctl, digest="d1", history=str(tmp_path / "sim.history"))
    ctl.plan = tmp_path / "plans" / "sim.json"
    ctl.plan.write_text(plan.to_json())
    ctl.sources = [str(tmp_path / "units" / "sparkinfra-lane-sim.service"), str(ctl.plan),
                   str(tmp_path / "plans" / "sim.env"), str(tmp_path / "plans" / "sim.secret.env"),
                   str(tmp_path / "mods" / "sim")]
    monkeypatch.setattr(lane_known.paths, "lane_set_paths", lambda lane: ctl.sources)
    monkeypatch.setattr(lane_known.paths, "rejected_path", lambda lane: str(tmp_path / f"{lane}.rejected"))
    return ctl


def _serving(ctl, monkeypatch, digest="d1", completes=True):
    (ctl.tmp / "marks" / "sim.started").write_text(json.dumps({"digest": digest, "at": 1.0}))
    monkeypatch.setattr(lane_io, "completion", lambda p, **kw: (completes, "ok" if completes else "HTTP 500"))


def test_a_set_keeps_the_ranks_placed_files_as_they_are_and_what_ran(ctl):
    p = lane_io.plan(str(ctl.plan))
    meta = lane_known.keep(p, 1, "it served", 2)
    folder = ctl.tmp / "known" / "1"
    assert meta["files"] == [s for s in ctl.sources if not s.endswith("secret.env")]  # what exists, in order
    for source in meta["files"]:
        kept = folder / "files" / source.lstrip("/")
        assert kept.exists(), source
    assert (folder / "files" / str(ctl.tmp / "mods/sim/hello/run.sh").lstrip("/")).read_text() == "echo hello\n"
    assert json.loads((folder / "meta.json").read_text()) == meta
    assert (meta["lane"], meta["digest"], meta["image"], meta["image_id"]) == ("sim", "d1", "img:1", "sha256:" + "ab" * 32)
    assert stat.S_IMODE((ctl.tmp / "known").stat().st_mode) == 0o700  # env files, the head's key file
    assert lane_known.entries() == [meta]
    assert set(meta["platform"]) == set(platform_facts.FIELDS)  # what ran beneath it (drift: test_platform_facts)


def test_only_the_newest_sets_stay_and_a_half_written_one_is_no_set(ctl):
    p = lane_io.plan(str(ctl.plan))
    for number in (1, 2, 3):
        lane_known.keep(_with(p, digest=f"d{number}"), number, "it served", 2)
    (ctl.tmp / "known" / ".4.tmp").mkdir()  # a keep cut off before its rename
    (ctl.tmp / "known" / "9").mkdir()  # no meta
    assert [m["number"] for m in lane_known.entries()] == [2, 3]
    assert sorted(f.name for f in (ctl.tmp / "known").iterdir()) == [".4.tmp", "2", "3", "9"]


def test_the_head_promotes_a_serving_lane_on_every_worker_first_then_keeps_it(ctl, monkeypatch, capsys):
    _serving(ctl, monkeypatch)
    p = _with(lane_io.plan(str(ctl.plan)), workers=[{"ip": "10.0.0.2", "rank": 1}])
    ctl.plan.write_text(p.to_json())
    calls = []

    def on_workers(workers, *args, timeout=30):
        calls.append(args)
        assert not (ctl.tmp / "known" / "1").exists(), "the head keeps its set after every worker"
        return [subprocess.CompletedProcess(args, 0, "", "") for _ in workers]

    monkeypatch.setattr(lane_io, "on_workers", on_workers)
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "it served after a converge"]) == 0
    assert calls == [tuple(lane_io.here("keep", str(ctl.plan), "1", "2", "it served after a converge"))]
    assert "lane sim: plan d1 (image img:1) is known good #1 on every node" in capsys.readouterr().out
    [event] = [json.loads(line) for line in (ctl.tmp / "sim.history").read_text().splitlines()]
    assert (event["event"], event["number"], event["digest"]) == ("promote", 1, "d1")
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "again"]) == 0  # already the newest: nothing kept
    assert "is known good #1 already" in capsys.readouterr().out and len(calls) == 1
    assert lane_ctl.main(["known", str(ctl.plan)]) == 0
    assert [m["number"] for m in json.loads(capsys.readouterr().out)] == [1]


def test_a_promotion_keeps_the_canarys_numbers_and_lifts_the_lanes_rejected_mark(ctl, monkeypatch):
    _serving(ctl, monkeypatch)
    (ctl.tmp / "sim.rejected").write_text(json.dumps({"digest": "d1", "why": "it failed its canary", "number": 1}))
    canary = {"decode_tps": {"json": 40.0}, "ttft_ms": 200.0, "shape": {"max_tokens": 64, "pp": 64, "tg": 16, "runs": 3}}
    journal = []
    monkeypatch.setattr(lane_io, "to_journal", lambda unit, message: journal.append((unit, message)))
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "it served", json.dumps(canary)]) == 0
    assert journal == [("sparkinfra-lane-sim.service", "promote (known good #1): it served")]  # sparkinfra logs
    [meta] = lane_known.entries()
    assert meta["canary"] == canary and lane_known.summary(meta)["canary"] == canary  # the next change's baseline
    [event] = [json.loads(line) for line in (ctl.tmp / "sim.history").read_text().splitlines()]
    assert event["canary"] == canary
    assert not (ctl.tmp / "sim.rejected").exists()


def test_a_rollback_by_hand_returns_to_the_set_asked_for_and_rejects_what_it_left(ctl, monkeypatch, capsys):
    restarted = []
    _failed_start(ctl, monkeypatch, restarted)  # sets #1 (d1) and the plan d2 placed
    monkeypatch.setattr(lane_ctl, "cmd_wait_ready", lambda path, timeout: 0)
    assert lane_ctl.main(["rollback", str(ctl.plan), "900", "was rolled back by hand", "7"]) == 1  # no set #7
    assert "no known good set #7" in capsys.readouterr().err and not restarted
    assert lane_ctl.main(["rollback", str(ctl.plan), "900", "was rolled back by hand", "1"]) == 0
    assert restarted == [("d1", "a rollback to known good #1: lane sim's plan d2 was rolled back by hand")]
    assert "rolled back to known good #1, lane sim plan d1, which serves again" in capsys.readouterr().err
    mark = json.loads((ctl.tmp / "sim.rejected").read_text())
    assert (mark["digest"], mark["number"], mark["why"]) == ("d2", 1, "it was rolled back by hand")


def test_a_lane_that_does_not_serve_its_plan_is_not_promoted(ctl, monkeypatch, capsys):
    _serving(ctl, monkeypatch, digest="d0")  # still runs the plan before
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "x"]) == 1
    assert "not promoted: it does not serve plan d1 (it runs d0)" in capsys.readouterr().err
    _serving(ctl, monkeypatch, completes=False)
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "x"]) == 1
    assert "(HTTP 500)" in capsys.readouterr().err
    assert lane_known.entries() == []


def test_a_worker_that_does_not_keep_the_set_fails_the_promotion_naming_it(ctl, monkeypatch, capsys):
    _serving(ctl, monkeypatch)
    p = _with(lane_io.plan(str(ctl.plan)), workers=[{"ip": "10.0.0.2", "rank": 1}])
    ctl.plan.write_text(p.to_json())
    monkeypatch.setattr(lane_io, "on_workers", lambda workers, *args, timeout=30: [
        subprocess.CompletedProcess(args, 1, "", "OSError: [Errno 28] No space left on device")])
    assert lane_ctl.main(["promote", str(ctl.plan), "2", "x"]) == 1
    err = capsys.readouterr().err
    assert "rank 1 on 10.0.0.2 did not keep known good #1: OSError: [Errno 28] No space left on device" in err
    assert lane_known.entries() == []


def test_status_lists_the_known_good_sets_newest_last():
    status = {"cluster": "sim", "lane": "sim", "digest": "d2", "serving": True, "models": [], "api": None,
              "nodes": [], "history": [], "problems": [],
              "known_good": [{"number": 1, "lane": "sim", "digest": "d1", "image": "img:1", "at": 0, "why": "it served"},
                             {"number": 2, "lane": "sim-b", "digest": "d2", "image": "img:2", "at": 0, "why": "it served"}]}
    shown = status_view.text(status).splitlines()
    at = shown.index("  known good (kept on every node to return to, newest last):")
    assert shown[at + 1].startswith("    #1  ") and shown[at + 1].endswith("lane sim, plan d1, image img:1: it served")
    assert "lane sim-b, plan d2" in shown[at + 2]
    assert shown[at + 3] == "    the sets name no image besides the one serving"
    status["nodes"] = [{"name": "spark-1", "rank": 0, "image_id": "sha256:b", "reached": False}]
    status["known_good"][0].update(image_id="sha256:a", image_bytes=3 * 2**30)
    status["known_good"][1].update(image_id="sha256:b", image_bytes=2**30)
    shown = status_view.text(status).splitlines()
    at = shown.index("  known good (kept on every node to return to, newest last):")
    assert shown[at + 1].endswith("image img:1 (3.0 GiB): it served")
    assert shown[at + 3] == ("    the sets keep 1 image(s) besides the one serving: 3.0 GiB on every node "
                             "(known_good_keep bounds how many sets stay)")
    status["known_good"][0]["image_bytes"] = None  # pruned by hand
    assert "image img:1 (MISSING on the head: a rollback to it cannot start)" in status_view.text(status)
    status["rejected"] = {"digest": "d3", "at": 0, "why": "it failed its canary: decode tok/s (json) 9.0, baseline 40.0"}
    assert any(line.startswith("  rejected: plan d3, ") and "--data retry_rejected=true" in line
               for line in status_view.text(status).splitlines())


def test_the_journal_gets_one_line_about_the_unit(monkeypatch):
    sent = []

    class Socket:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def connect(self, path):
            sent.append(path)

        def send(self, data):
            sent.append(data.decode())

    monkeypatch.setattr(lane_io.socket, "socket", Socket)
    lane_io.to_journal("sparkinfra-lane-sim.service", "rollback (known good #1):\n two lines")
    assert sent == ["/run/systemd/journal/socket", "MESSAGE=rollback (known good #1): two lines\n"
                    "OBJECT_SYSTEMD_UNIT=sparkinfra-lane-sim.service\nSYSLOG_IDENTIFIER=sparkinfra\n"]


def test_a_command_on_a_worker_reaches_its_shell_argument_by_argument(monkeypatch):
    """ssh hands the worker one line: a reason with spaces, or the lanes' unit pattern, stays one argument."""
    ran = []
    monkeypatch.setattr(lane_io, "sh", lambda *args, **kw: ran.append(args) or subprocess.CompletedProcess(args, 0))
    lane_io.on_worker("10.0.0.2", "python3", "/p", "lane_ctl", "keep", "/e/sim.json", "1", "2", "it served; after a converge")
    lane_io.on_worker("10.0.0.2", "systemctl", "list-units", "sparkinfra-lane-*.service")
    assert ran[0][-8:] == ("python3", "/p", "lane_ctl", "keep", "/e/sim.json", "1", "2", "'it served; after a converge'")
    assert ran[1][-3:] == ("systemctl", "list-units", "'sparkinfra-lane-*.service'")


def test_a_set_is_put_back_whole_over_what_a_later_converge_placed(ctl):
    p = lane_io.plan(str(ctl.plan))
    lane_known.keep(p, 1, "it served", 2, sources=ctl.sources)
    ctl.plan.write_text(_with(p, digest="d2").to_json())  # a later converge's plan, env and mods
    (ctl.tmp / "plans" / "sim.env").write_text("A=2\n")
    (ctl.tmp / "mods" / "sim" / "new").mkdir()
    meta = lane_known.restore(1)
    assert meta["digest"] == "d1" and lane_io.plan(str(ctl.plan)).digest == "d1"
    assert (ctl.tmp / "plans" / "sim.env").read_text() == "A=1\n"
    assert sorted(f.name for f in (ctl.tmp / "mods" / "sim").iterdir()) == ["hello"]


def _failed_start(ctl, monkeypatch, restarted):
    """Lane sim's plan d2 placed over known good #1 (d1); its start failed (the history says why)."""
    p = lane_io.plan(str(ctl.plan))
    lane_known.keep(p, 1, "it served", 2)
    ctl.plan.write_text(_with(p, digest="d2", workers=[{"ip": "10.0.0.2", "rank": 1}]).to_json())
    (ctl.tmp / "sim.history").write_text(json.dumps({"event": "stop", "why": "rank 0 container exited with status 1",
                                                     "failed": True, "at": 1.0}) + "\n")
    ran, remote = [], []
    monkeypatch.setattr(lane_io, "sh", lambda *a, **kw: ran.append(a) or subprocess.CompletedProcess(a, 0, "journal\n", ""))
    monkeypatch.setattr(lane_io, "on_workers", lambda workers, *a, timeout=30: remote.append(a) or [
        subprocess.CompletedProcess(a, 0, "worker journal\n", "") for _ in workers])
    monkeypatch.setattr(lane_known.paths, "FAILED_STARTS", str(ctl.tmp / "failed"))
    monkeypatch.setattr(lane_known.paths, "plan_path", lambda lane: str(ctl.tmp / "plans" / f"{lane}.json"))
    monkeypatch.setattr(lane_ctl, "cmd_restart", lambda path, why: restarted.append((lane_io.plan(path).digest, why)) or 0)
    return ran, remote


def test_a_failed_start_is_rolled_back_to_the_known_good_set_on_every_node(ctl, monkeypatch, capsys):
    restarted = []
    ran, remote = _failed_start(ctl, monkeypatch, restarted)
    monkeypatch.setattr(lane_ctl, "cmd_wait_ready", lambda path, timeout: 1 if lane_io.plan(path).digest == "d2" else 0)
    assert lane_ctl.main(["rollout", str(ctl.plan), "900", "its plan changed"]) == 1
    assert [d for d, _ in restarted] == ["d2", "d1"]  # the new plan, then the known good put back
    assert restarted[1][1] == ("a rollback to known good #1: lane sim's plan d2 did not start "
                               "(rank 0 container exited with status 1)")
    assert lane_io.plan(str(ctl.plan)).digest == "d1"  # this node's files are the set's again
    assert tuple(lane_io.here("restore", str(ctl.plan), "1")) in remote  # ... and every worker's
    assert ("systemctl", "stop", "sparkinfra-lane-sim.service") in ran
    assert ("systemctl", "disable", "sparkinfra-lane-sim.service") not in ran  # the same lane: it stays enabled
    [logs] = list((ctl.tmp / "failed").iterdir())
    assert sorted(f.name for f in logs.iterdir()) == ["rank0.log", "rank1.log"]
    assert (logs / "rank1.log").read_text() == "worker journal\n"
    err = capsys.readouterr().err
    assert (f"lane sim: plan d2 did not start (rank 0 container exited with status 1): rolled back to known good #1, "
            f"lane sim plan d1, which serves again (0s); every rank's journal of what was left: {logs}") in err
    events = [json.loads(line) for line in (ctl.tmp / "sim.history").read_text().splitlines()]
    assert events[-1]["event"] == "rollback" and events[-1]["number"] == 1 and events[-1]["left"] == "d2"
    mark = json.loads((ctl.tmp / "sim.rejected").read_text())  # a converge with these settings refuses d2 now
    assert (mark["digest"], mark["number"]) == ("d2", 1) and mark["why"].startswith("it did not start (rank 0")


def test_a_start_that_serves_is_not_rolled_back(ctl, monkeypatch):
    restarted = []
    _failed_start(ctl, monkeypatch, restarted)
    monkeypatch.setattr(lane_ctl, "cmd_wait_ready", lambda path, timeout: 0)
    assert lane_ctl.main(["rollout", str(ctl.plan), "900", "its plan changed"]) == 0
    assert [d for d, _ in restarted] == ["d2"] and not (ctl.tmp / "failed").exists()


def test_a_failed_start_with_no_other_known_good_set_says_so_and_keeps_its_logs(ctl, monkeypatch, capsys):
    restarted = []
    _failed_start(ctl, monkeypatch, restarted)
    monkeypatch.setattr(lane_ctl, "cmd_wait_ready", lambda path, timeout: 1)
    monkeypatch.setattr(lane_known, "entries", lambda root=None: [{"number": 1, "lane": "sim", "digest": "d2"}])
    assert lane_ctl.main(["rollout", str(ctl.plan), "900", "x"]) == 1
    assert [d for d, _ in restarted] == ["d2"]
    assert "no known good set to return to; every rank's journal:" in capsys.readouterr().err


def test_a_set_holds_what_a_converge_placed_not_the_history_or_the_runtime_marks():
    from sparkinfra.node import paths

    kept = paths.lane_set_paths("sim")
    assert set(kept) <= set(paths.lane_paths("sim"))
    assert paths.plan_path("sim") in kept and paths.validated_path("sim") in kept and f"{paths.MODS_DIR}/sim" in kept
    assert paths.history_path("sim") not in kept and not [k for k in kept if k.startswith(paths.MARKS_DIR)]


def test_a_failed_start_never_returns_to_a_plan_an_operator_rolled_back_from(ctl, monkeypatch):
    """#1 (d1) served, #2 (d9) was rolled back by hand to #1: a later change's rollback goes to #1."""
    p = lane_io.plan(str(ctl.plan))
    lane_known.keep(p, 1, "it served", 3)
    lane_known.keep(_with(p, digest="d9"), 2, "it served", 3)
    (ctl.tmp / "sim.rejected").write_text(json.dumps({"digest": "d9", "why": "it was rolled back by hand", "number": 1}))
    assert lane_known.rollback_target(_with(p, digest="d5"))["number"] == 1
    (ctl.tmp / "sim.rejected").unlink()
    assert lane_known.rollback_target(_with(p, digest="d5"))["number"] == 2


def test_status_names_the_set_a_rollback_by_hand_goes_to_and_the_cli_takes_it(ctl):
    """The head's choice, one rule with an automatic rollback's: never the running plan, nor a rejected one."""
    from sparkinfra.cli import rollback as rollback_view

    p = lane_io.plan(str(ctl.plan))  # placed: d1
    lane_known.keep(p, 1, "it served", 3)
    lane_known.keep(_with(p, digest="d9"), 2, "it served", 3)
    found = lane_known.status(p, "d9")  # d9 runs (placed d1 not started yet)
    assert [k["number"] for k in found["known"]] == [1, 2] and found["rejected"] is None
    assert found["rollback_to"] == 1
    status = {"lane": "sim", "started": "d9", "unit": "active", **found}
    assert rollback_view.target(status, None)[0]["number"] == 1
    assert rollback_view.target(status, 2) == (None, "known good #2 (lane sim plan d9) is what runs now")
    assert rollback_view.target(status, 7) == (None, "no known good set #7 on the head (kept: #1, #2)")
    (ctl.tmp / "sim.rejected").write_text(json.dumps({"digest": "d1", "why": "it was rolled back by hand"}))
    found = lane_known.status(p, "d9")
    assert found["rollback_to"] is None and found["rejected"]["digest"] == "d1"
    assert rollback_view.target({**status, **found}, None) == (
        None, "no known good set of another plan than the running one (nor a rejected one)")
