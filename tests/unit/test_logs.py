"""
``python -m sparkinfra logs``: the node side (``scripts/lane_journal.py``, run here against a fake
``journalctl``), the merge and the line format, the reads of ``--follow``, and the command's
argument errors; nothing connects (``remote`` is monkeypatched).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from sparkinfra import remote, scripts
from sparkinfra.cli import logs
from sparkinfra.run import load_files

T0 = 1796551200_000000  # 2026-12-06 10:00:00 UTC, in microseconds
ENTRIES = [
    {"__REALTIME_TIMESTAMP": str(T0 + 123456), "MESSAGE": "INFO starting vLLM", "__CURSOR": "s=ab;i=1", "_PID": "7"},
    {"__REALTIME_TIMESTAMP": str(T0 + 1_000000), "MESSAGE": list("ERROR café ".encode()) + [0xFF],
     "__CURSOR": "s=ab;i=2"},
    {"__REALTIME_TIMESTAMP": str(T0 + 2_500000), "MESSAGE": "INFO Application startup complete",
     "__CURSOR": "s=ab;i=3"},
]
JOURNAL = "".join(json.dumps(e) + "\n" for e in ENTRIES) + "\n-- cursor: s=ab;i=3\n"

FAKE_JOURNALCTL = """#!{python}
import json, os, sys
with open(os.environ["FAKE_ARGV"], "w") as f:
    json.dump(sys.argv[1:], f)
with open(os.environ["FAKE_OUT"]) as f:
    sys.stdout.write(f.read())
if os.environ.get("FAKE_ERR"):
    sys.stderr.write(os.environ["FAKE_ERR"] + "\\n")
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


@pytest.fixture
def node(tmp_path):
    """A node's PATH with a fake ``journalctl`` (and ``python3``, this interpreter) first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text(FAKE_JOURNALCTL.format(python=sys.executable))
    fake.chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_ARGV": str(tmp_path / "argv.json"), "FAKE_OUT": str(tmp_path / "journal.out")}
    (tmp_path / "journal.out").write_text(JOURNAL)

    def journal(query: dict, out: str | None = None, rc: int = 0, err: str = ""):
        if out is not None:
            (tmp_path / "journal.out").write_text(out)
        done = subprocess.run([sys.executable, "-c", scripts.text("lane_journal.py"), json.dumps(query)],
                              env={**env, "FAKE_RC": str(rc), "FAKE_ERR": err},
                              capture_output=True, text=True, timeout=20)
        return done

    def argv() -> list[str]:
        return json.loads((tmp_path / "argv.json").read_text())

    return SimpleNamespace(journal=journal, argv=argv, env=env)


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


QUERY = {"unit": "sparkinfra-lane-sim.service", "grep": "", "since": "", "lines": 100}
BASE_ARGV = ["-u", "sparkinfra-lane-sim.service", "-o", "json", "--no-pager", "--show-cursor"]


# scripts/lane_journal.py
# -----------------------


def test_the_entries_then_the_cursor(node):
    done = node.journal(QUERY)
    assert done.returncode == 0, done.stderr
    assert _lines(done.stdout) == [
        {"t": T0 + 123456, "m": "INFO starting vLLM"},
        {"t": T0 + 1_000000, "m": "ERROR café \ufffd"},  # journald's bytes of a message that is not UTF-8
        {"t": T0 + 2_500000, "m": "INFO Application startup complete"},
        {"cursor": "s=ab;i=3"},
    ]
    assert node.argv() == [*BASE_ARGV, "-n", "100"]


def test_grep_is_matched_on_the_node_and_the_cursor_still_advances(node):
    done = node.journal({**QUERY, "grep": r"^INFO .*complete"})
    assert _lines(done.stdout) == [{"t": T0 + 2_500000, "m": "INFO Application startup complete"},
                                   {"cursor": "s=ab;i=3"}]
    journal = "".join(json.dumps(e) + "\n" for e in ENTRIES)  # no --show-cursor line: the last entry's
    done = node.journal({**QUERY, "grep": "ERROR"}, out=journal)
    assert _lines(done.stdout) == [{"t": T0 + 1_000000, "m": "ERROR café \ufffd"}, {"cursor": "s=ab;i=3"}]
    done = node.journal({**QUERY, "grep": "nothing matches this"})
    assert done.returncode == 0 and _lines(done.stdout) == [{"cursor": "s=ab;i=3"}]


def test_after_a_cursor(node):
    done = node.journal({**QUERY, "after": "s=ab;i=3", "since": "-10m", "lines": 100}, out="-- cursor: s=ab;i=3\n")
    assert node.argv() == [*BASE_ARGV, "--after-cursor", "s=ab;i=3"]  # neither --since nor -n
    assert _lines(done.stdout) == [{"cursor": "s=ab;i=3"}]
    done = node.journal({**QUERY, "after": "s=ab;i=3"}, out="")  # no entry, no cursor line: the same cursor
    assert _lines(done.stdout) == [{"cursor": "s=ab;i=3"}]


@pytest.mark.parametrize("since, lines, tail", [
    ("-10m", None, ["--since", "-10m"]),
    ("2026-12-06 10:00", 20, ["--since", "2026-12-06 10:00", "-n", "20"]),
    ("", 0, ["-n", "0"]),
    ("", None, []),
    ("@1796551200", None, ["--since", "@1796551200"]),
])
def test_since_and_lines(node, since, lines, tail):
    assert node.journal({**QUERY, "since": since, "lines": lines}).returncode == 0
    assert node.argv() == [*BASE_ARGV, *tail]


def test_lines_zero_still_gives_the_cursor(node):
    done = node.journal({**QUERY, "lines": 0}, out="-- cursor: s=ab;i=9\n")
    assert _lines(done.stdout) == [{"cursor": "s=ab;i=9"}]


def test_a_failing_journalctl(node):
    done = node.journal(QUERY, out="", rc=1, err="Failed to open journal: Permission denied")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "journalctl: Failed to open journal: Permission denied\n"
    done = node.journal(QUERY, out="", rc=3)
    assert done.returncode == 1 and done.stderr == "journalctl: exit 3\n"


def test_read_journal_through_the_command_it_sends(node, monkeypatch):
    """logs.read_journal's command, run here by sh as a node's shell runs it."""
    sent = []

    def run(host, command, timeout=60, print_output=False):
        sent.append((host, timeout))
        done = subprocess.run(["sh", "-c", command.get_raw_value()], env=node.env, capture_output=True, text=True,
                              timeout=20)
        return done.returncode == 0, done.stdout, done.stderr

    monkeypatch.setattr(remote, "run", run)
    entries, cursor, error = logs.read_journal("spark-1", {**QUERY, "grep": "it's \"quoted\"|INFO"})
    assert error == "" and cursor == "s=ab;i=3" and sent == [("spark-1", 120)]
    assert entries == [(T0 + 123456, "INFO starting vLLM"), (T0 + 2_500000, "INFO Application startup complete")]
    monkeypatch.setitem(node.env, "FAKE_RC", "1")
    monkeypatch.setitem(node.env, "FAKE_ERR", "Failed to open journal")
    entries, cursor, error = logs.read_journal("spark-1", {**QUERY, "after": "s=ab;i=2"})
    assert cursor == "s=ab;i=2" and error == "journalctl: Failed to open journal"


# merged(), line(), next_query()
# ------------------------------


def test_merged_in_time_order_and_stable():
    batches = [  # equal times: the batches' order (not the names'), then each node's own order
        ("spark-2", 1, [(5, "b1"), (30, "b2"), (40, "b3")]),
        ("spark-1", 0, [(10, "a1"), (30, "a2"), (30, "a0"), (50, "a4")]),
        ("spark-3", 2, []),
    ]
    assert logs.merged(batches) == [
        (5, "spark-2", 1, "b1"), (10, "spark-1", 0, "a1"), (30, "spark-2", 1, "b2"), (30, "spark-1", 0, "a2"),
        (30, "spark-1", 0, "a0"), (40, "spark-2", 1, "b3"), (50, "spark-1", 0, "a4"),
    ]
    assert logs.merged([]) == [] and logs.merged([("spark-1", 0, [])]) == []


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_line_format(utc):
    assert logs.line(T0 + 123456, "spark-1", 0, "INFO starting", 7) == \
        "2026-12-06 10:00:00.123 spark-1 rank 0 | INFO starting"
    assert logs.line(T0 + 999999, "n2", 1, "x | y", 7) == "2026-12-06 10:00:00.999 n2      rank 1 | x | y"
    assert logs.line(T0 + 61_000500, "spark-10", 9, "", 8) == "2026-12-06 10:01:01.000 spark-10 rank 9 | "
    # Several lines in one entry (a traceback, a progress bar's carriage returns): each is prefixed.
    assert logs.line(T0, "n2", 1, "Loading 0%\rLoading 50%\r\nTraceback:\n  x\n", 2).splitlines() == [
        "2026-12-06 10:00:00.000 n2 rank 1 | Loading 0%",
        "2026-12-06 10:00:00.000 n2 rank 1 | Loading 50%",
        "2026-12-06 10:00:00.000 n2 rank 1 | Traceback:",
        "2026-12-06 10:00:00.000 n2 rank 1 |   x",
    ]


def test_next_query():
    query = {"unit": "sparkinfra-lane-sim.service", "grep": "ERR", "since": "", "lines": 100}
    assert logs.next_query(query, "", True, 1796551200) == query
    assert logs.next_query(query, "s=ab;i=3", True, 1796551200) == query  # the first read: as asked
    assert logs.next_query(query, "s=ab;i=3", False, 1796551200) == {**query, "after": "s=ab;i=3"}
    assert logs.next_query(query, "", False, 1796551200) == {**query, "since": "@1796551200", "lines": None}
    assert query == {"unit": "sparkinfra-lane-sim.service", "grep": "ERR", "since": "", "lines": 100}


# main()
# ------


@pytest.fixture(scope="module")
def sim_settings():
    _, settings = load_files("inventory/sim.py")
    return settings


@pytest.fixture
def offline(sim_settings, monkeypatch):
    """logs.main with the settings already read and the nodes' journals answered here."""
    state = SimpleNamespace(unreachable={}, journals={}, asked=[], connected=[])
    monkeypatch.setattr(remote, "settings_of", lambda inventory, data: (None, sim_settings))

    def connect(inventory, clusters):
        state.connected.append([c.name for c in clusters])
        return [remote.Reached(c, {n.name: n.name for n in c.nodes if n.name not in state.unreachable},
                               dict(state.unreachable)) for c in clusters]

    def read_journal(host, query):
        state.asked.append((host, query))
        answers = state.journals[host]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(remote, "connect", connect)
    monkeypatch.setattr(logs, "read_journal", read_journal)
    return state



def test_main_a_bad_grep(nothing_connects, monkeypatch, capsys):
    with pytest.raises(SystemExit) as raised:
        logs.main(["inventory/sim.py", "--grep", "(unclosed"])
    assert raised.value.code == 2
    assert "error: --grep: missing ), unterminated subpattern" in capsys.readouterr().err


@pytest.mark.parametrize("lane", ["../sim", "sim b", "-x"])
def test_main_a_lane_with_a_bad_name(offline, capsys, lane):
    assert logs.main(["inventory/sim.py", f"--lane={lane}"]) == 2
    assert capsys.readouterr().err.startswith("sparkinfra logs: --lane: ")
    assert offline.connected == []


def test_main_an_unknown_rank(offline, capsys):
    assert logs.main(["inventory/sim.py", "--rank", "7"]) == 2
    assert capsys.readouterr().err == "sparkinfra logs: cluster sim has no rank [7]\n"
    assert offline.connected == []


def test_main_an_unknown_cluster(offline, capsys):
    assert logs.main(["inventory/sim.py", "--cluster", "nope"]) == 2
    assert capsys.readouterr().err == "sparkinfra logs: no cluster 'nope' in the inventory (it has: sim)\n"


def test_main_a_bad_inventory_path(nothing_connects, monkeypatch, capsys):
    assert logs.main(["inventory/no-such-inventory.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkinfra logs: ") and "inventory/no-such-inventory.py" in err


def test_main_merges_every_rank(offline, capsys, utc):
    offline.journals = {"spark-1": [([(T0 + 5, "head early"), (T0 + 2_000000, "head late")], "c1", "")],
                        "spark-2": [([(T0 + 1_000000, "worker")], "c2", "")]}
    assert logs.main(["inventory/sim.py", "--since", "10 min ago", "--grep", "e"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "2026-12-06 10:00:00.000 spark-1 rank 0 | head early",
        "2026-12-06 10:00:01.000 spark-2 rank 1 | worker",
        "2026-12-06 10:00:02.000 spark-1 rank 0 | head late",
    ]
    query = {"unit": "sparkinfra-lane-sim.service", "grep": "e", "since": "10 min ago", "lines": None}
    assert offline.asked == [("spark-1", query), ("spark-2", query)]


def test_main_one_rank_another_lane_default_lines(offline, capsys):
    offline.journals = {"spark-2": [([], "", "")]}
    assert logs.main(["inventory/sim.py", "--rank", "1", "--lane", "sim-b"]) == 0
    assert offline.asked == [("spark-2", {"unit": "sparkinfra-lane-sim-b.service", "grep": "", "since": "",
                                          "lines": 100})]
    assert capsys.readouterr().out == ""


def test_main_a_node_not_reached_or_failing(offline, capsys, utc):
    offline.unreachable["spark-2"] = "not reachable (timed out)"
    offline.journals = {"spark-1": [([(T0, "head")], "c1", "journalctl: Failed to open journal")]}
    assert logs.main(["inventory/sim.py"]) == 1
    out, err = capsys.readouterr()
    assert out == "2026-12-06 10:00:00.000 spark-1 rank 0 | head\n"
    assert err.splitlines() == ["spark-2 (rank 1) not reached: not reachable (timed out)",
                                "spark-1 (rank 0): journalctl: Failed to open journal"]
    assert [host for host, _ in offline.asked] == ["spark-1"]


def test_follow_holds_entries_so_a_late_rank_still_prints_in_time_order():
    held = logs.Held()
    assert held.ready([(5_000000, "spark-1", 0, "later")], now=10.0) == []  # held FOLLOW_LAG
    # spark-2's earlier line reaches the controller a poll later: it still prints first.
    assert held.ready([(4_900000, "spark-2", 1, "earlier")], now=11.0) == []
    assert [row[3] for row in held.ready([], now=10.0 + logs.FOLLOW_LAG)] == ["earlier", "later"]
    assert held.ready([(6_000000, "spark-1", 0, "last")], now=13.0) == []
    assert [row[3] for row in held.ready([], now=float("inf"))] == ["last"]  # a stop prints what is held


def test_main_follow_reads_after_each_cursor(offline, capsys, monkeypatch, utc):
    offline.journals = {
        "spark-1": [([(T0, "one")], "c1", ""), ([(T0 + 3_000000, "three")], "c2", ""), ([], "c2", "")],
        "spark-2": [([], "", ""), ([(T0 + 2_000000, "two")], "d1", ""), ([], "d1", "")],
    }
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    clock = SimpleNamespace(time=lambda: 1796551300.7, sleep=sleep, monotonic=lambda: 100.0 + len(sleeps))
    monkeypatch.setattr(logs, "time", clock)
    assert logs.main(["inventory/sim.py", "--follow", "--lines", "5"]) == 0
    assert [line.split(" | ")[1] for line in capsys.readouterr().out.splitlines()] == ["one", "two", "three"]
    base = {"unit": "sparkinfra-lane-sim.service", "grep": "", "since": "", "lines": 5}
    assert offline.asked == [
        ("spark-1", base), ("spark-2", base),
        ("spark-1", {**base, "after": "c1"}), ("spark-2", {**base, "since": "@1796551300", "lines": None}),
        ("spark-1", {**base, "after": "c2"}), ("spark-2", {**base, "after": "d1"}),
    ]
    assert sleeps == [logs.FOLLOW_EVERY] * 3
