"""
Runs on the head (stdlib only): reads what the in-image vLLM check printed on stdin -- the lane's
mods' lines first (``apply_mods.sh``), then ``vllm_check.py``'s JSON report as the last line --
and says it in one line: on stdout when vLLM accepts every rank (exit 0), else on stderr (exit 1).
The mods' lines go to stderr as they were.

    docker run ... IMAGE [apply_mods.sh DIR MOD... --] python3 vllm_check.py < REQUEST | python3 check_report.py
"""

import json
import sys


def say(lines):
    """(ok, the line to print) for the check's output ``lines``."""
    report = {}
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = {}
    if not isinstance(report, dict) or "ok" not in report:
        return False, "the image's vLLM check gave no report (a mod failed, or the check could not run: see above)"
    vllm = report.get("vllm")
    if report.get("ok"):
        return True, f"vLLM {vllm} accepts every rank"
    if report.get("rank") is not None:
        return False, f"vLLM {vllm} refuses rank {report.get('rank')}: {report.get('error')}"
    return False, f"the image's vLLM cannot check the lane: {report.get('error')}"


def main():
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    for line in lines[:-1]:
        print(line, file=sys.stderr)
    ok, line = say(lines)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
