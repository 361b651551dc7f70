"""
``sparkinfra.bench``: probes against a tiny local OpenAI-style server (timing, token counting, the
API key sent and never shown), llama-benchy's command line (checked against its own parser) and
JSON report (``fixtures/bench/benchy_sweep.json``, built with llama-benchy's own result models),
the results folder (golden ``results.md``, PNG plots read back as matplotlib objects) and
``compare``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkinfra.bench import job, probes, report
from sparkinfra.cli.bench import main
from sparkinfra.bench.benchy import Row, benchy_command, parse_benchy
from sparkinfra.bench.probes import BenchError, chat_url, probe, warmup
from sparkinfra.lanes import find_lane
from sparkinfra.bench.report import (
    Meta,
    compare,
    plot_decode_vs_depth,
    plot_users,
    render_markdown,
    write_results,
)

FIXTURES = Path(__file__).parent / "fixtures" / "bench"
KEY = "sk-test-0123456789-secret"
PNG = b"\x89PNG\r\n\x1a\n"


def sweep_raw() -> dict:
    return json.loads((FIXTURES / "benchy_sweep.json").read_text())


def probes_fixture() -> list[dict]:
    return json.loads((FIXTURES / "probes.json").read_text())


def meta(**kw) -> Meta:
    base = dict(cluster="quad-a", lane="awq-fp8kv", image_id="sha256:3f9c0e1d2b4a", model="cyankiwi/MiniMax-M3-AWQ-INT4",
                model_revision="5b1d0c7e", nccl_version="2.30.4", gmu=0.7, timestamp="2026-07-05T11:42:09Z")
    return Meta(**{**base, **kw})


# Probes against a local server
# -----------------------------


class Server:
    """A canned ``/v1/chat/completions`` on 127.0.0.1 that records what it was sent."""

    def __init__(self, completion_tokens: int = 256, delay: float = 0.05, status: int = 200):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                time.sleep(delay)
                if status != 200:
                    payload = json.dumps({"error": {"message": "Invalid API key"}}).encode()
                else:
                    payload = json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 40},
                                     "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 61, "completion_tokens": completion_tokens,
                                  "total_tokens": 61 + completion_tokens},
                    }).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_chat_url():
    assert chat_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"


def test_probe_times_counts_and_sends_key(capsys):
    with Server(completion_tokens=256, delay=0.05) as server:
        records = probe(server.url, "org/model", KEY, "json", False, 3)
    assert len(records) == 3 and [r["run"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["completion_tokens"] == 256 and r["prompt_tokens"] == 61 and r["finish_reason"] == "length"
        assert 0.05 <= r["wall_s"] < 2
        assert r["decode_tps"] == pytest.approx(256 / r["wall_s"], rel=1e-3)
        assert r["workload"] == "json" and r["thinking"] is False and r["max_tokens"] == 256
    sent = server.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == f"Bearer {KEY}"
    body = sent["body"]
    assert body["temperature"] == 0 and body["max_tokens"] == 256 and body["stream"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"][0]["content"] == probes.WORKLOADS["json"]
    out = capsys.readouterr()
    assert KEY not in json.dumps(records) + out.out + out.err


def test_probe_thinking_default_and_no_key():
    with Server() as server:
        probe(server.url + "/v1", "org/model", None, "code", None, 1, max_tokens=32)
        probe(server.url, "org/model", "", "code", True, 1)
    first, second = server.requests
    assert "chat_template_kwargs" not in first["body"] and first["auth"] is None and first["body"]["max_tokens"] == 32
    assert second["body"]["chat_template_kwargs"] == {"enable_thinking": True} and second["auth"] is None


def test_probe_thinking_through_the_lanes_switch():
    """The M3 lanes switch thinking with thinking_mode (seed 001): the probes send the lane's own values."""
    switch = find_lane("pair-a-balanced").thinking.model_dump()
    assert switch == {"key": "thinking_mode", "off_value": "disabled", "on_value": "enabled"}
    with Server() as server:
        probe(server.url, "org/model", None, "json", False, 1, switch=switch)
        warmup(server.url, "org/model", None, workloads=("code",), thinking=(True, None), switch=switch)
    sent = [r["body"].get("chat_template_kwargs") for r in server.requests]
    assert sent == [{"thinking_mode": "disabled"}, {"thinking_mode": "enabled"}, None]
    assert find_lane("sim").thinking.model_dump() == probes.DEFAULT_SWITCH  # a lane that says nothing


def test_probe_error_never_shows_the_key():
    with Server(status=401) as server:
        with pytest.raises(BenchError) as e:
            probe(server.url, "org/model", KEY, "json", False, 1)
    assert "HTTP 401" in str(e.value) and "Invalid API key" in str(e.value) and KEY not in str(e.value)


def test_probe_unreachable():
    with pytest.raises(BenchError, match="127.0.0.1:9"):
        probe("http://127.0.0.1:9", "m", KEY, "json", False, 1, timeout=2)


def test_probe_unknown_workload():
    with pytest.raises(ValueError, match="one of json, code"):
        probe("http://127.0.0.1:9", "m", None, "yaml", False, 1)


def test_warmup_one_request_per_shape():
    with Server(delay=0) as server:
        records = warmup(server.url, "org/model", KEY, workloads=("json", "code"), thinking=(False, None))
    assert len(server.requests) == 4 and all(r["warmup"] for r in records)
    assert {(r["workload"], r["thinking"]) for r in records} == {("json", False), ("json", None), ("code", False), ("code", None)}


# llama-benchy
# ------------


def test_benchy_command_is_accepted_by_llama_benchy(monkeypatch):
    config = pytest.importorskip("llama_benchy.config")
    argv = benchy_command("http://10.0.0.1:8000", "org/model", "/models/snap", [2048], [32, 128], [0, 8192],
                          [1, 2, 4], save_result="/tmp/out.json", runs=5, coherence=False)
    assert argv[:3] == [sys.executable, "-m", "llama_benchy"]
    monkeypatch.setattr(sys, "argv", ["llama-benchy", *argv[3:]])
    parsed = config.BenchmarkConfig.from_args()
    assert parsed.base_url == "http://10.0.0.1:8000/v1" and parsed.model == "org/model"
    assert parsed.tokenizer == "/models/snap" and parsed.result_format == "json" and parsed.save_result == "/tmp/out.json"
    assert parsed.pp_counts == [2048] and parsed.tg_counts == [32, 128] and parsed.depths == [0, 8192]
    assert parsed.concurrency_levels == [1, 2, 4] and parsed.num_runs == 5 and parsed.skip_coherence
    assert parsed.latency_mode == "generation" and parsed.api_key == "EMPTY"
    assert parsed.extra_body == {}


def test_the_sweep_sets_the_lanes_thinking_switch_as_the_probes_do(monkeypatch):
    """M3's template thinks by default: a sweep that sends no switch measures another workload."""
    config = pytest.importorskip("llama_benchy.config")
    m3 = {"key": "thinking_mode", "off_value": "disabled", "on_value": "enabled"}
    off = probes.template_kwargs(False, m3)
    assert off == {"thinking_mode": "disabled"} and probes.request_body("m", "json", False, 8, m3)["chat_template_kwargs"] == off
    argv = benchy_command("http://h:8000", "m", "/t", [64], [16], [0], [1], template_kwargs=off)
    monkeypatch.setattr(sys, "argv", ["llama-benchy", *argv[3:]])
    assert config.BenchmarkConfig.from_args().extra_body == {"chat_template_kwargs": {"thinking_mode": "disabled"}}
    with pytest.raises(ValueError, match="one chat template switch at a time"):
        benchy_command("http://h", "m", "/t", [1], [1], [0], [1], template_kwargs={"a": 1, "b": 2})


def test_benchy_command_takes_the_key_from_the_environment_into_no_argv(tmp_path):
    # A stand-in for llama_benchy's __main__: what it parses, and what the kernel shows to ps.
    (tmp_path / "argv_echo.py").write_text(
        "import json, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cmdline': open('/proc/self/cmdline').read()}))\n"
    )
    argv = benchy_command("http://h:8000/v1", "m", "/t", [128], [32], [0], [1], "BENCH_KEY", module="argv_echo")
    assert KEY not in " ".join(argv)
    env = {"BENCH_KEY": KEY, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout)
    assert seen["argv"][-2:] == ["--api-key", KEY] and seen["argv"][:3] == ["--base-url", "http://h:8000/v1", "--model"]
    assert KEY not in seen["cmdline"] and "--base-url" in seen["cmdline"]
    for name, module in (("BENCH KEY; rm -rf /", "llama_benchy"), ("BENCH_KEY", "x'); import os; os.system('id")):
        with pytest.raises(ValueError):
            benchy_command("http://h", "m", "/t", [1], [1], [0], [1], name, module=module)


def test_parse_benchy_fixture():
    rows = parse_benchy((FIXTURES / "benchy_sweep.json").read_text())
    assert len(rows) == 12
    first = sweep_raw()["benchmarks"][0]
    r = rows[0]
    assert (r.pp, r.tg, r.depth, r.concurrency, r.phase) == (2048, 128, 0, 1, "std")
    assert r.tg_tps == first["tg_throughput"]["mean"] and r.tg_req_tps == r.tg_tps
    assert r.pp_tps == first["pp_throughput"]["mean"] and r.e2e_ttft_ms == first["e2e_ttft"]["mean"]
    assert {(x.depth, x.concurrency) for x in rows} == {(d, c) for d in (0, 8192, 32768, 65536) for c in (1, 2, 4)}
    assert r.label == "pp2048/tg128 @ d0 (c1)"


def test_parse_benchy_from_stdout_and_context_phase():
    raw = sweep_raw()
    ctx = dict(raw["benchmarks"][3], is_context_prefill_phase=True, tg_throughput=None)
    raw["benchmarks"].append(ctx)
    stdout = ("llama-benchy (0.4.0)\nDate: 2026-07-05 11:40:01\nPrinting results in JSON format:\n\n"
              + json.dumps(raw, indent=2) + "\n\nllama-benchy (0.4.0)\ndate: 2026-07-05 11:40:01 | latency mode: generation\n")
    rows = parse_benchy(stdout)
    assert len(rows) == 13 and rows[-1].phase == "ctx" and rows[-1].tg_tps is None
    assert rows[:12] == parse_benchy(sweep_raw())
    with pytest.raises(ValueError):
        parse_benchy("no report here")


# Results
# -------


def test_markdown_golden():
    text = render_markdown(meta(), probes_fixture(), parse_benchy(sweep_raw()))
    assert text == (FIXTURES / "results.md.golden").read_text()


def test_markdown_single_point_and_no_sweep():
    row = Row(pp=128, tg=32, depth=0, concurrency=1, pp_tps=1913.0, tg_tps=42.3, e2e_ttft_ms=1130.0)
    text = render_markdown(meta(gmu=None, extra={"drafter": "eagle3 k=2"}), [], [row])
    assert "| 0 | 1913 tok/s | 42.3 tok/s | 1.13 s |" in text
    assert "| gpu_memory_utilization | — |" in text and "| drafter | `eagle3 k=2` |" in text
    assert "## Probes" not in text and "## Users" not in text
    assert "no prefill rate" not in text
    unmeasured = render_markdown(meta(), [], [dataclasses.replace(row, pp_tps=None)])
    assert "| 0 | — | 42.3 tok/s | 1.13 s |" in unmeasured and "llama-benchy reports no prefill rate" in unmeasured
    probes_only = render_markdown(meta(), probes_fixture(), [])
    assert "## Probes" in probes_only and "Depth sweep" not in probes_only


def test_plots_have_labels_and_lines():
    rows = parse_benchy(sweep_raw())
    depth_fig = plot_decode_vs_depth(rows, "quad-a/awq-fp8kv")
    ax = depth_fig.axes[0]
    assert ax.get_xlabel() == "context depth (tokens)" and ax.get_ylabel() == "decode tok/s (all users)"
    assert ax.get_title() == "Decode throughput vs context depth — quad-a/awq-fp8kv"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1 user", "2 users", "4 users"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "8k", "32k", "64k"]
    one_user = ax.get_lines()[0]
    assert list(one_user.get_xdata()) == [0, 8192, 32768, 65536]
    assert list(one_user.get_ydata()) == [r.tg_tps for r in rows if r.concurrency == 1]

    users_fig = plot_users(rows, "quad-a/awq-fp8kv")
    ax = users_fig.axes[0]
    assert ax.get_xlabel() == "concurrent users" and ax.get_ylabel() == "decode tok/s"
    assert ax.get_title().startswith("Decode throughput vs concurrent users")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["aggregate (pp2048/tg128, depth 0)", "per user (pp2048/tg128, depth 0)"]
    aggregate, per_user = ax.get_lines()
    assert list(aggregate.get_xdata()) == [1, 2, 4]
    assert all(a >= p for a, p in zip(aggregate.get_ydata(), per_user.get_ydata()))
    assert plot_users([]) is None and plot_decode_vs_depth([]) is None


def test_write_results_folder(tmp_path):
    raw = sweep_raw()
    folder = write_results(tmp_path / "results", meta(), probes_fixture(), parse_benchy(raw), benchy_raw=raw)
    assert folder == tmp_path / "results" / "quad-a" / "awq-fp8kv" / "20260705T114209Z"
    assert sorted(p.name for p in folder.iterdir()) == ["decode_vs_depth.png", "results.json", "results.md", "users.png"]
    for png in ("decode_vs_depth.png", "users.png"):
        data = (folder / png).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    saved = json.loads((folder / "results.json").read_text())
    assert saved["meta"] == dataclasses.asdict(meta()) and saved["benchy_raw"] == raw
    assert len(saved["probes"]) == 20 and len(saved["sweep"]) == 12
    assert (folder / "results.md").read_text() == (FIXTURES / "results.md.golden").read_text()
    m, probes, rows = report.load_results(folder)
    assert m == meta() and rows == parse_benchy(raw) and probes == probes_fixture()


def test_write_results_probes_only_has_no_plots(tmp_path):
    folder = write_results(tmp_path, meta(lane="balanced"), probes_fixture(), [])
    assert sorted(p.name for p in folder.iterdir()) == ["results.json", "results.md"]


def _run_b(tmp_path: Path) -> Path:
    rows = [dataclasses.replace(r, tg_tps=r.tg_tps * 1.05) for r in parse_benchy(sweep_raw()) if r.depth != 65536]
    rows.append(Row(pp=2048, tg=128, depth=131072, concurrency=1, tg_tps=21.0))
    probes = [dict(p, decode_tps=p["decode_tps"] - 1.0) for p in probes_fixture()]
    b = meta(nccl_version="2.30.7", gmu=0.69, timestamp="2026-07-06T08:00:00Z", extra={"drafter_k": 3})
    return write_results(tmp_path, b, probes, rows)


def test_compare(tmp_path):
    a = write_results(tmp_path, meta(), probes_fixture(), parse_benchy(sweep_raw()))
    b = _run_b(tmp_path)
    text = compare(a, b)
    assert text.startswith(f"A: {a}\nB: {b}\n")
    assert "| nccl_version | `2.30.4` | `2.30.7` |" in text and "| gmu | `0.7` | `0.69` |" in text
    assert "| extra.drafter_k | `None` | `3` |" in text and "| model |" not in text
    r = parse_benchy(sweep_raw())[0]
    after = r.tg_tps * 1.05
    assert f"| pp2048/tg128 @ d0 (c1) | decode tok/s | {r.tg_tps:.1f} | {after:.1f} | {after - r.tg_tps:+.1f} | +5.0% |" in text
    assert "| pp2048/tg128 @ d0 (c2) | decode tok/s per user |" in text
    assert "| json, thinking disabled | 36.6 | 35.6 | -1.0 |" in text
    assert "Only in A: pp2048/tg128 @ d65536 (c1), pp2048/tg128 @ d65536 (c2), pp2048/tg128 @ d65536 (c4)" in text
    assert "Only in B: pp2048/tg128 @ d131072 (c1)" in text


def test_compare_cli(tmp_path, capsys):
    a = write_results(tmp_path, meta(), probes_fixture(), parse_benchy(sweep_raw()))
    b = _run_b(tmp_path)
    assert main(["--compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out == compare(a, b)
    assert main(["--compare", str(a), str(tmp_path / "missing")]) == 2
    assert "no results.json" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-m", "sparkinfra", "bench", "--compare", str(a), str(a)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and "## Meta\n\n(same)" in done.stdout


# A run from deploys/bench.py: what it takes from the head, and llama-benchy's book
# ---------------------------------------------------------------------------------


def test_tokenizer_names_never_take_weights():
    files = {
        "config.json": 700, "generation_config.json": 120, "tokenizer.json": 2_100_000, "tokenizer_config.json": 3_000,
        "special_tokens_map.json": 400, "chat_template.jinja": 900, "merges.txt": 450_000, "vocab.json": 800_000,
        "model-00001-of-00002.safetensors": 5 << 30, "model.safetensors.index.json": 60_000, "README.md": 9_000,
        "tokenizer.model": 500_000, ".sparkinfra-manifest.json": 4_000,
    }
    assert job.tokenizer_names(files) == [
        "chat_template.jinja", "config.json", "generation_config.json", "merges.txt", "special_tokens_map.json",
        "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json",
    ]


def test_seed_book_places_the_file_where_llama_benchy_caches_its_url(tmp_path, monkeypatch):
    import hashlib

    from llama_benchy.corpus import TokenizedCorpus

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    book = tmp_path / "book.txt"
    book.write_text("It was a dark and stormy night. " * 50)
    url = job.seed_book(str(book))
    assert url == book.resolve().as_uri()
    cached = tmp_path / "home" / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"
    assert cached.read_text() == book.read_text()
    # llama-benchy itself finds it there (no download): its own loader, with a stand-in tokenizer.
    corpus = TokenizedCorpus.__new__(TokenizedCorpus)
    corpus.book_url = url
    corpus.tokenizer = type("T", (), {"encode": staticmethod(lambda text, add_special_tokens=False: text.split())})
    assert corpus._load_data()[:4] == ["It", "was", "a", "dark"]
    book.write_text("changed")
    job.seed_book(str(book))
    assert cached.read_text() == "changed"
    assert job.seed_book("") is None
    with pytest.raises(probes.BenchError, match="bench_book .*missing.txt: no such file"):
        job.seed_book(str(tmp_path / "missing.txt"))


def test_fetch_tokenizer_copies_once_by_size(tmp_path):
    copied = []

    class Head:
        name = "spark-1"

        def get_file(self, remote, local, _sudo=False):
            copied.append(remote)
            Path(local).write_text("x" * 5)
            return True

    the_job = job.Job(
        base_url="http://h:8000", served_model="tiny", api_key_env="", snapshot="/hf/snap",
        tokenizer_files={"tokenizer.json": 5, "config.json": 5}, probes=1, max_tokens=8, workloads=["json"],
        thinking=[False], thinking_switch=probes.DEFAULT_SWITCH, sweep_thinking=False, pp=[], tg=[1], depth=[0],
        concurrency=[1], runs=1, book="",
        coherence=False,
        results_dir=str(tmp_path), meta=report.Meta(cluster="c", lane="l", model="org/m", model_revision="abc"),
    )
    folder = job.fetch_tokenizer(Head(), the_job, cache=tmp_path / "cache")
    assert folder == tmp_path / "cache" / "org--m@abc"
    assert sorted(copied) == ["/hf/snap/config.json", "/hf/snap/tokenizer.json"]
    job.fetch_tokenizer(Head(), the_job, cache=tmp_path / "cache")
    assert len(copied) == 2  # same sizes: nothing copied again
    with pytest.raises(probes.BenchError, match="holds no tokenizer files"):
        job.fetch_tokenizer(Head(), dataclasses.replace(the_job, tokenizer_files={}), cache=tmp_path / "cache")
