"""
Runs on the head (stdlib only): reads what the in-image vLLM check printed on stdin -- the lane's
mods' lines first (``apply_mods.sh``), then ``vllm_check.py``'s JSON report as the last line --
and says it in one line: on stdout when vLLM accepts every rank (exit 0), else on stderr (exit 1).
The mods' lines go to stderr as they were.

    docker run ... IMAGE [apply_mods.sh DIR MOD... --] python3 vllm_check.py < REQUEST 2> LOG | python3 check_report.py [LOG]

LOG: the check's stderr (vLLM's own lines), of which the last ones are printed when the check fails.
The report's warnings (the image rules that warn) follow the verdict, a line each.
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
    warned = "".join(f"\nwarning: {said}" for said in report.get("warnings") or [])
    if report.get("ok"):
        return True, f"vLLM {vllm} accepts every rank{warned}"
    if report.get("rank") is not None:
        return False, f"vLLM {vllm} refuses rank {report.get('rank')}: {report.get('error')}"
    if str(report.get("error") or "").startswith("rule "):
        return False, f"the lane's image: {report['error']}{warned}"
    return False, f"the image's vLLM cannot check the lane: {report.get('error')}"


LOG_TAIL = 30  # lines of vLLM's own output shown with a failure


def main():
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    for line in lines[:-1]:
        print(line, file=sys.stderr)
    ok, line = say(lines)
    if not ok and len(sys.argv) > 1:
        try:
            logged = [x for x in open(sys.argv[1], errors="replace").read().splitlines() if x.strip()]
        except OSError:
            logged = []
        for x in logged[-LOG_TAIL:]:
            print(x, file=sys.stderr)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
