"""
The lane runner's means (stdlib only): its plan and runtime marks, the shell, the workers over
the head's fabric SSH mesh, the lanes' units, the lane's API.
"""

from __future__ import annotations

import hmac
import json
import os
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .plan import RunnerPlan, Worker


def plan(path: str) -> RunnerPlan:
    return RunnerPlan.read(path)


def mark(p: RunnerPlan, name: str) -> Path:
    """This lane's runtime mark ``name`` (started, warm, trial.env)."""
    return Path(p.marks_dir) / f"{p.lane}.{name}"


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by root only from its first byte (marks may hold a key's stamp)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def key_stamp(p: RunnerPlan, key: str = "") -> dict | None:
    """
    The API-key file's HMAC under ``key`` (a new random one when empty), kept with the key in the
    root-only ``started`` mark: tells whether the key changed since the lane started, while no
    digest of the key appears in the plan, the status or pyinfra's output. None without a file.
    """
    path = p.api_key_file
    if not path or not os.path.exists(path):
        return None
    key = key or os.urandom(32).hex()
    return {"key": key, "hmac": hmac.new(bytes.fromhex(key), Path(path).read_bytes(), "sha256").hexdigest()}


def here(*args: str) -> list[str]:
    """This runner's argv with ``args``, from the folder it was placed in (the same on every node)."""
    return ["python3", str(Path(__file__).resolve().parent), "lane_ctl", *args]


def to_journal(unit: str, message: str) -> None:
    """``message`` in the journal as about ``unit`` (what ``journalctl -u UNIT``, and so
    ``sparkinfra logs``, shows beside the unit's own lines); never fails."""
    fields = f"MESSAGE={' '.join(message.split())}\nOBJECT_SYSTEMD_UNIT={unit}\nSYSLOG_IDENTIFIER=sparkinfra\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
            journal.connect("/run/systemd/journal/socket")
            journal.send(fields.encode())
    except OSError:
        pass


def say(message: str) -> None:
    print(f"lane: {message}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = False, timeout: float | None = 60) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=timeout)


SSH_FAILED = 255  # ssh's own status: the command did not run there (no route, refused, a changed key)


def on_worker(ip: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command (an argv: each argument quoted for the worker's shell, which ssh hands one line) as
    root on a worker over the head's fabric SSH mesh; a worker that does not answer within ``timeout``
    ends as ssh's own failure (``SSH_FAILED``), never as an exception."""
    try:
        return sh("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", ip, "sudo", "-n", *map(shlex.quote, args),
                  timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, SSH_FAILED, "", f"ssh {ip}: no answer within {timeout:.0f}s")


def reached(result: subprocess.CompletedProcess) -> bool:
    """Whether ``on_worker``'s command ran on the worker (its own status, whatever it is)."""
    return result.returncode != SSH_FAILED


def worker_failure(result: subprocess.CompletedProcess, last: int = 300) -> str:
    """Why a command ``on_worker`` ran failed there: ssh's reason when it did not reach the worker,
    else the end of the command's own stderr."""
    return ssh_error(result) if not reached(result) else result.stderr.strip()[-last:]


def ssh_error(result: subprocess.CompletedProcess) -> str:
    """Why ``on_worker`` did not reach the worker, in one line; a changed host key by its name."""
    text = result.stderr or ""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key verification failed" in text:
        return ("its SSH host key changed (not the key the head's mesh pinned): a converge re-pins it from "
                "the key the controller trusts")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"ssh exited {result.returncode}"


def on_workers(workers: list[Worker], *args: str, timeout: float = 30) -> list[subprocess.CompletedProcess]:
    """``on_worker`` on every worker at once (8 nodes stop and start as fast as 2), in their order."""
    with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
        return list(pool.map(lambda w: on_worker(w.ip, *args, timeout=timeout), workers))


def unit_state(unit: str) -> str:
    return sh("systemctl", "is-active", unit).stdout.strip() or "unknown"


def other_lane_units(p: RunnerPlan) -> list[str]:
    listed = sh("systemctl", "list-units", "--plain", "--no-legend", "--state=active,activating,reloading",
                p.lane_units).stdout
    units = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [u for u in units if u != p.unit]


def api_key(p: RunnerPlan) -> str:
    """The API key from the head's root-only secret env file (``VLLM_API_KEY=...``), if any."""
    path = p.api_key_file
    if path and os.path.exists(path):
        for line in Path(path).read_text().splitlines():
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1].strip()
    return ""


def request(p: RunnerPlan, path: str, body: dict | None = None, timeout: float = 10) -> tuple[int, dict | str]:
    url = f"http://127.0.0.1:{p.api_port}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    key = api_key(p)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def port_open(p: RunnerPlan) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", p.api_port)) == 0


def completion(p: RunnerPlan, max_tokens: int = 1, timeout: float = 60, **extra) -> tuple[bool, str]:
    """A real chat completion: True when it returns at least one token."""
    body = {"model": p.served_model_name, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "ping"}]}
    body.update(extra)
    status, reply = request(p, "/v1/chat/completions", body, timeout=timeout)
    if status != 200 or not isinstance(reply, dict):
        return False, f"HTTP {status}: {str(reply)[:200]}"
    tokens = (reply.get("usage") or {}).get("completion_tokens", 0)
    return tokens > 0, f"{tokens} completion tokens"


def lane_of_unit(p: RunnerPlan, unit: str) -> str:
    """The lane whose unit is ``unit`` (the plan's ``lane_units`` pattern); '' when it is none."""
    prefix, _, suffix = p.lane_units.partition("*")
    if unit.startswith(prefix) and unit.endswith(suffix) and len(unit) > len(prefix) + len(suffix):
        return unit[len(prefix):len(unit) - len(suffix)]
    return ""


def docker_answers() -> bool:
    """Whether this node's Docker daemon answers (its server version)."""
    return sh("docker", "version", "-f", "{{.Server.Version}}", timeout=30).returncode == 0


def image_id(image: str) -> str:
    return sh("docker", "image", "inspect", "-f", "{{.Id}}", image).stdout.strip()


def api_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def unit_state_remote(ip: str, p: RunnerPlan) -> str:
    result = on_worker(ip, "systemctl", "is-active", p.unit, timeout=20)
    return result.stdout.strip() if reached(result) else f"not reached: {ssh_error(result)}"


def restarts(unit: str) -> int:
    value = sh("systemctl", "show", "-p", "NRestarts", "--value", unit).stdout.strip()
    return int(value) if value.isdigit() else 0
