"""
A lane's journal on this node for ``python -m sparkinfra logs`` (read-only; stdlib only; run as
root with the node's python3, sent as ``python3 -c TEXT QUERY``).

    lane_journal.py QUERY

QUERY is a JSON object: ``unit``; ``since`` (journalctl's ``--since``, e.g. ``-10m`` or a date),
``lines`` (the last N entries; null: all), ``after`` (a cursor: only entries after it, for ``--follow``),
``grep`` (a Python regular expression the message must match). Prints one JSON object per entry,
``{"t": microseconds since the epoch, "m": message}``, then ``{"cursor": ...}``: the journal's
position after the last entry read (matching or not), which the next ``after`` continues from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys


def message(entry: dict) -> str:
    text = entry.get("MESSAGE", "")
    if isinstance(text, list):  # journald gives a message that is not UTF-8 as its bytes
        text = bytes(text).decode("utf-8", "replace")
    return str(text)


def main(query: dict) -> int:
    args = ["journalctl", "-u", query["unit"], "-o", "json", "--no-pager", "--show-cursor"]
    if query.get("after"):
        args += ["--after-cursor", query["after"]]
    elif query.get("since"):
        args += ["--since", query["since"]]
    if query.get("lines") is not None and not query.get("after"):
        args += ["-n", str(int(query["lines"]))]
    pattern = re.compile(query["grep"]) if query.get("grep") else None
    cursor = query.get("after") or ""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as journal:
        for line in journal.stdout:
            if line.startswith("-- cursor: "):  # --show-cursor: also after no entry (-n 0)
                cursor = line[len("-- cursor: "):].strip()
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            cursor = entry.get("__CURSOR", cursor)
            text = message(entry)
            if pattern is None or pattern.search(text):
                print(json.dumps({"t": int(entry.get("__REALTIME_TIMESTAMP", 0)), "m": text}))
        error = journal.stderr.read().strip()
    if journal.returncode != 0:
        print(f"journalctl: {error or 'exit ' + str(journal.returncode)}", file=sys.stderr)
        return 1
    print(json.dumps({"cursor": cursor}))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
