"""
A guarded change on the simulated pair (issue 40), each drill from lane sim serving and each ending
with it serving and ``verify`` passing. The changes go through the bed's engine-hooks mod (lane sim
carries it, inert until the lane's environment switches it): a step delay slows every decode step,
an engine that refuses to start fails a start the head's in-image check passed. A client polls the
API all along: the old lane answers through every preparation step, until the restart.

Each drill starts the lane two or three times (about 30 s each on 2 cores): they are ``long``
(``make test-all``); CI proves the canary on every promotion it makes (test_e2e_zy_lane).
"""

import json
import re
import subprocess
import sys
import threading
import time

import pytest

import sparkbed as simbed

INV = "inventory/sim.py"
SLOW = 'lane_env={"SPARKBED_STEP_DELAY": "0.1"}'  # 100 ms before every engine step: decode ~10x slower
SAME = 'lane_env={"SPARKBED_STEP_DELAY": "0"}'  # a changed plan, the engine as fast
FAILS = 'lane_env={"SPARKBED_ENGINE_FAIL": "1"}'
ROLLED = re.compile(r"rolled back to known good #(\d+), lane sim plan (\w+), which serves again \((\d+)s\); "
                    r"every rank's journal of what was left: (\S+)")

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def serving(bed):
    bed.ensure(2)
    bed.converge(INV, "deploys/serve.py")
    return bed


class Poller:
    """A client asking the head's API for one token every half second, from the controller's side
    of the bed (the management namespace), each answer kept with its time."""

    def __init__(self, bed):
        self.answers: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        key = simbed.controller_env().get("SPARKBED_API_KEY", "")
        head = simbed.sim_nodes(2)[0].mgmt_ip
        self.request = ["ip", "netns", "exec", simbed.MGMT_NS, sys.executable, "-S", "-c",
                        f"import json, urllib.request as u; r = u.Request('http://{head}:8000/v1/completions', "
                        "data=json.dumps({'model': 'tiny', 'prompt': 'hi', 'max_tokens': 1}).encode(), "
                        f"headers={{'Content-Type': 'application/json', 'Authorization': 'Bearer {key}'}}); "
                        "u.urlopen(r, timeout=5).read()"]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            ok = subprocess.run(self.request, capture_output=True, timeout=20).returncode == 0
            self.answers.append((time.time(), ok))  # when it ended: one in flight at the stop fails
            self.stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)


def _history(bed) -> list[dict]:
    out = bed.node("spark-1", "cat /var/lib/sparkinfra/lanes/sim.history").stdout
    return [json.loads(line) for line in out.splitlines()]


def _serving_digest(bed) -> str:
    return json.loads(bed.node("spark-1", "cat /run/sparkinfra/lanes/sim.started").stdout)["digest"]


def _answered_until_the_restart(poller: Poller, bed) -> None:
    """Every answer before systemd began stopping the old lane (its journal) completed; the last too."""
    since = int(poller.answers[0][0])
    out = bed.node("spark-1", f"journalctl -u sparkinfra-lane-sim.service --since @{since} -o short-unix --no-pager "
                              "| grep -m1 'Stopping'").stdout
    stopping = float(out.split()[0])
    before = [ok for at, ok in poller.answers if at < stopping]
    assert len(before) >= 3 and all(before), f"the old lane stopped answering before its stop: {poller.answers}"
    assert poller.answers[-1][1], "the lane rolled back to does not answer"


def _site_serves(bed, digest: str) -> None:
    assert _serving_digest(bed) == digest
    check = bed.verify(INV)
    assert check.returncode == 0, check.output[-3000:]


def test_a_change_that_decodes_slower_is_rolled_back_by_its_canary(serving):
    """The change starts and is ready, but its canary decodes ~10x slower than the known good set's:
    rolled back, the converge exits 1 with both numbers; the next converge of that change refuses,
    saying the site and the cluster differ."""
    bed = serving
    before = _serving_digest(bed)
    with Poller(bed) as poller:
        run = bed.converge(INV, "deploys/serve.py", SLOW, check=False)
    said = run.stderr + str(run.results)
    assert run.returncode != 0, said[-4000:]
    failed = re.search(r"lane sim: plan (\w+) failed its canary: decode tok/s \((code|json)\) ([\d.]+), baseline ([\d.]+)",
                       said)
    assert failed and float(failed[3]) < 0.4 * float(failed[4]), said[-4000:]
    back = ROLLED.search(said)
    assert back and back[2] == before, said[-4000:]
    print(f"canary: {failed[2]} {failed[3]} tok/s against {failed[4]}; the old lane answered {back[3]} s after")
    _answered_until_the_restart(poller, bed)
    events = [e["event"] for e in _history(bed)]
    assert events[-3:] in (["rollback", "start", "ready"], ["stop", "rollback", "start"]), events
    refused = bed.converge(INV, "deploys/serve.py", SLOW, check=False)
    assert refused.returncode != 0
    assert (f"the site and the cluster differ. The settings ask for lane sim plan {failed[1]}, which was rolled back"
            in refused.stderr), refused.stderr[-3000:]
    assert "--data retry_rejected=true" in refused.stderr
    _site_serves(bed, before)


def test_a_change_as_fast_is_promoted_then_rolled_back_by_hand(serving):
    """An as-fast change passes its canary and becomes the newest known good set, the one before
    kept; ``python -m sparkinfra rollback`` returns to it; the change's converge then refuses."""
    bed = serving
    before = _serving_digest(bed)
    with Poller(bed) as poller:
        run = bed.converge(INV, "deploys/serve.py", SAME)
    promoted = re.search(r"lane sim: plan (\w+) \(image \S+\) is known good #(\d+) on every node: .*canary decode tok/s",
                         run.stderr)
    assert promoted, run.stderr[-3000:]
    _answered_until_the_restart(poller, bed)
    known = json.loads(bed.node("spark-1", "python3 /usr/local/lib/sparkinfra/node lane_ctl known "
                                           "/etc/sparkinfra/lanes/sim.json").stdout)
    assert [k["digest"] for k in known][-2:] == [before, promoted[1]], known  # the one before kept to return to
    hand = bed.controller(sys.executable, "-m", "sparkinfra", "rollback", INV, timeout=900)
    assert hand.returncode == 0, (hand.stdout + hand.stderr)[-3000:]
    assert f"lane sim (plan {promoted[1]}) -> known good #{known[-2]['number']}" in hand.stdout
    assert f"plan {promoted[1]} was rolled back by hand: rolled back to known good" in hand.stdout, hand.stdout[-2000:]
    assert _serving_digest(bed) == before
    logs = bed.controller(sys.executable, "-m", "sparkinfra", "logs", INV, "--rank", "0", "--since", "30 min ago",
                          "--grep", "promote|rollback")
    said = [line.split(" | ", 1)[1] for line in logs.stdout.splitlines()]
    assert f"promote (known good #{promoted[2]}): it served, warm, after a converge; canary " in "\n".join(said), said
    assert any(line.startswith(f"rollback (known good #{known[-2]['number']}): a rollback to known good") for line in said)
    refused = bed.converge(INV, "deploys/serve.py", SAME, check=False)
    assert refused.returncode != 0 and "the site and the cluster differ" in refused.stderr, refused.stderr[-3000:]
    assert "which was rolled back on" in refused.stderr and "it was rolled back by hand" in refused.stderr
    _site_serves(bed, before)


def test_a_start_that_fails_after_the_image_check_is_rolled_back_naming_the_mod(serving):
    """The engine refuses to start (the mod's hook), which the head's in-image check cannot see (it
    builds no engine): the start fails, the known good set serves again, the converge exits 1 naming
    the mod, and every rank's journal is kept."""
    bed = serving
    before = _serving_digest(bed)
    run = bed.converge(INV, "deploys/serve.py", FAILS, check=False)
    said = run.stderr + str(run.results)
    assert run.returncode != 0, said[-4000:]
    first = re.search(r"its first error: (.*)", said)
    assert first and "mod sparkbed-engine-hooks: the engine refuses to start" in first[1], (first and first[0], said[-4000:])
    back = ROLLED.search(said)
    assert back and back[2] == before, said[-4000:]
    logs = back[4]
    assert "mod sparkbed-engine-hooks: the engine refuses to start" in bed.node("spark-1", f"cat {logs}/rank0.log").stdout
    _site_serves(bed, before)
