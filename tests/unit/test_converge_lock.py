"""
``sparkinfra/scripts/converge_lock.sh``, run here as ``lock.py`` runs it on a head: the first run
holds the lock until it says release; a second run is told BUSY with the holder; a run that dies
drops the lock with its connection, and the next one is told STALE with the holder it left.
"""

from __future__ import annotations

import subprocess

from sparkinfra import converge_lock, scripts

HOLDER = '{"pid": 4242, "user": "ops"}'


def holder(tmp_path, who: str = HOLDER) -> subprocess.Popen:
    lock, holder_file = tmp_path / "run" / "converge.lock", tmp_path / "run" / "converge.holder"
    return subprocess.Popen(
        ["sh", "-c", scripts.text("converge_lock.sh"), "converge_lock.sh", str(lock), str(holder_file), who],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def lines(proc: subprocess.Popen, n: int) -> list[str]:
    return [proc.stdout.readline().strip() for _ in range(n)]


def test_first_holds_second_is_busy_release_frees(tmp_path):
    first = holder(tmp_path)
    assert lines(first, 3) == ["FREE", "", "HELD"]
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    second = holder(tmp_path, '{"pid": 1}')
    assert lines(second, 2) == ["BUSY", HOLDER] and second.wait(timeout=10) == 1
    first.communicate("release\n", timeout=10)
    assert first.returncode == 0
    assert not (tmp_path / "run" / "converge.holder").exists()
    third = holder(tmp_path)
    assert lines(third, 3) == ["FREE", "", "HELD"]
    third.communicate("release\n", timeout=10)


def test_a_run_that_dies_leaves_a_stale_holder_and_no_lock(tmp_path):
    first = holder(tmp_path)
    assert lines(first, 3) == ["FREE", "", "HELD"]
    first.kill()
    first.wait(timeout=10)
    second = holder(tmp_path, '{"pid": 2}')
    assert lines(second, 3) == ["STALE", HOLDER, "HELD"]
    second.communicate("release\n", timeout=10)


def test_the_holder_record_names_the_files_never_an_options_value():
    """The holder record sits on the head (and in its holding shell's argv): ``--data`` values,
    which may carry anything, stay on the controller."""
    argv = ["-y", "inventory/pair.py", "deploys/serve.py", "--data", "lane=secret-lane", "--data",
            "hf_endpoint=http://u:p@mirror", "--limit", "spark-1", "-vvv"]
    assert converge_lock.command_line(argv) == "pyinfra inventory/pair.py deploys/serve.py"
