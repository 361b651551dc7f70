"""A changed lane's canary: its numbers, its baseline (a known good set's canary or a bench
result), and the verdict against the lane's tolerances."""

from __future__ import annotations

import json

import pytest

from sparkinfra.bench import canary
from sparkinfra.bench.probes import BenchError
from sparkinfra.bench.report import Meta, write_results

SHAPE = {"max_tokens": 64, "pp": 64, "tg": 16, "runs": 3}


def _canary(**changes) -> canary.Canary:
    fields = dict(lane="sim", base_url="http://10.0.0.1:8000", served_model="tiny", api_key_env="", switch={},
                  workloads=("json", "code"), max_tokens=64, runs=3, pp=64, tg=16, book="", coherence=False,
                  decode_tolerance=0.1, ttft_tolerance=0.25, baseline_results="", model="m/tiny", revision="r1",
                  snapshot="/models/snap")
    return canary.Canary(**{**fields, **changes})


def _numbers(json_tps=40.0, code_tps=40.0, ttft=200.0, shape=SHAPE) -> dict:
    return {"decode_tps": {"json": json_tps, "code": code_tps}, "ttft_ms": ttft, "tg_tps": None, "shape": dict(shape)}


def test_within_the_tolerances_nothing_fails_and_every_comparison_is_said():
    failed, said = canary.compare(_numbers(37.0, 41.0, 240.0), _numbers(), 0.1, 0.25)
    assert failed == []
    assert said == ["decode tok/s (code) 41.0, baseline 40.0 (+2%, may fall 10%)",
                    "decode tok/s (json) 37.0, baseline 40.0 (-8%, may fall 10%)",
                    "TTFT 240 ms, baseline 200 ms (+20%, may rise 25%)"]


def test_a_slower_decode_or_a_later_first_token_fails_naming_the_measure_and_both_numbers():
    failed, _ = canary.compare(_numbers(20.0, 40.0, 260.0), _numbers(), 0.1, 0.25)
    assert failed == ["decode tok/s (json) 20.0, baseline 40.0 (-50%, may fall 10%)",
                      "TTFT 260 ms, baseline 200 ms (+30%, may rise 25%)"]


def test_no_baseline_fails_nothing_and_another_shape_is_not_compared():
    assert canary.compare(_numbers(1.0), None, 0.1, 0.25) == ([], [])
    other = _numbers(shape={**SHAPE, "max_tokens": 256, "pp": 2048})
    failed, said = canary.compare(_numbers(1.0, 1.0, 9000.0), other, 0.1, 0.25)
    assert failed == [] and said == ["decode not compared: the baseline's probes were 256 tokens, these 64"]


def test_the_baseline_is_the_lanes_newest_known_good_canary_unless_the_settings_name_a_bench_result():
    known = [{"number": 1, "lane": "sim", "digest": "d1", "canary": _numbers(30.0)},
             {"number": 2, "lane": "sim", "digest": "d2", "canary": _numbers(40.0)},
             {"number": 3, "lane": "sim-b", "digest": "d3", "canary": _numbers(99.0)},  # another lane's
             {"number": 4, "lane": "sim", "digest": "d4", "canary": None}]  # promoted before canaries
    base, source = canary.baseline(_canary(), known)
    assert base["decode_tps"]["json"] == 40.0 and source == "known good #2 (plan d2)"
    assert canary.baseline(_canary(), []) == (None, "no known good set of lane sim with canary numbers")


def _bench_result(tmp_path, lane="sim"):
    probes = [{"workload": w, "thinking": t, "run": r, "max_tokens": 64, "completion_tokens": 64, "decode_tps": tps,
               "wall_s": 1.0, "finish_reason": "length"}
              for w, rates in (("json", (38.0, 40.0, 44.0)), ("code", (30.0, 31.0, 90.0)))
              for t in (False, True) for r, tps in enumerate(rates)]
    probes.append({"workload": "json", "thinking": False, "run": 0, "max_tokens": 64, "completion_tokens": 64,
                   "decode_tps": 1.0, "wall_s": 1.0, "finish_reason": "length", "warmup": True})
    raw = {"benchmarks": [
        {"prompt_size": 64, "response_size": 16, "context_size": 128, "concurrency": 1, "ttfr": {"values": [900.0]}},
        {"prompt_size": 64, "response_size": 16, "context_size": 0, "concurrency": 1,
         "ttfr": {"values": [210.0, 190.0, 400.0]}, "tg_throughput": {"values": [40.0, 41.0, 39.0]}},
    ]}
    return write_results(tmp_path, Meta(cluster="sim", lane=lane, timestamp="2026-12-07T08:00:00Z"), probes, [],
                         benchy_raw=raw)


def test_a_bench_result_as_baseline_takes_its_thinking_off_probes_and_its_depth_zero_row(tmp_path):
    folder = _bench_result(tmp_path)
    base, source = canary.baseline(_canary(baseline_results=str(folder)), [])
    assert source == f"bench result {folder}"
    assert base["decode_tps"] == {"code": 31.0, "json": 40.0}  # medians; no warm-up, no thinking-on probe
    assert base["ttft_ms"] == 210.0 and base["tg_tps"] == 40.0
    assert base["shape"]["max_tokens"] == 64 and (base["shape"]["pp"], base["shape"]["tg"]) == (64, 16)


def test_a_bench_result_of_another_lane_or_no_result_is_refused(tmp_path):
    with pytest.raises(BenchError, match="measured lane sim-b, not sim"):
        canary.baseline(_canary(baseline_results=str(_bench_result(tmp_path, "sim-b"))), [])
    with pytest.raises(BenchError, match="not a bench result"):
        canary.baseline(_canary(baseline_results=str(tmp_path / "nothing")), [])


def test_measure_takes_the_median_of_the_runs_after_one_warm_up_each(monkeypatch):
    asked = []

    def probe(url, model, key, workload, thinking, n, max_tokens, switch=None):
        asked.append((workload, thinking, n, max_tokens))
        rates = {"json": [50.0, 10.0, 40.0], "code": [30.0, 31.0, 32.0]}[workload]
        return [{"decode_tps": r, "completion_tokens": 64, "finish_reason": "length"} for r in rates][:n]

    monkeypatch.setattr(canary, "warmup", lambda *a, **kw: asked.append("warm-up"))
    monkeypatch.setattr(canary, "probe", probe)
    measured = canary.measure(_canary(pp=None), None, log=lambda line: None)
    assert asked == ["warm-up", ("json", False, 3, 64), ("code", False, 3, 64)]  # thinking off, 3 runs each
    assert measured == {"decode_tps": {"json": 40.0, "code": 31.0}, "ttft_ms": None, "tg_tps": None,
                        "shape": {"max_tokens": 64, "pp": None, "tg": 16, "runs": 3}}
    assert canary.describe(measured) == "decode tok/s code 31.0, json 40.0 (median of 3)"


def test_a_lane_that_answers_no_tokens_fails_its_canary(monkeypatch):
    monkeypatch.setattr(canary, "warmup", lambda *a, **kw: None)
    monkeypatch.setattr(canary, "probe", lambda *a, **kw: [{"decode_tps": None, "completion_tokens": 0}] * 3)
    with pytest.raises(BenchError, match="the json probe answered no tokens"):
        canary.measure(_canary(pp=None), None, log=lambda line: None)


def test_llama_benchys_report_gives_the_median_ttft_of_the_depth_zero_one_user_row():
    raw = {"benchmarks": [{"prompt_size": 64, "response_size": 16, "context_size": 0, "concurrency": 2,
                           "ttfr": {"values": [1.0]}},
                          {"prompt_size": 64, "response_size": 16, "context_size": 0, "concurrency": 1,
                           "ttfr": {"values": [25.4, 24.6, 30.0]}, "tg_throughput": {"values": [49.2, 49.1, 10.0]}}]}
    assert canary.benchy_numbers(raw, 64, 16) == {"ttft_ms": 25.4, "tg_tps": 49.1}
    assert canary.benchy_numbers(json.loads('{"benchmarks": []}'), 64, 16) == {"ttft_ms": None, "tg_tps": None}


def test_the_bed_clusters_settings_override_its_lanes_tolerances():
    from sparkinfra.cluster_lane import cluster_lane
    from sparkinfra.run import load_files

    _, settings = load_files("inventory/sim.py")
    on = cluster_lane(settings.clusters["sim"])
    c = canary.of_lane(on)
    assert (on.lane.canary.decode_tolerance, on.lane.canary.ttft_tolerance) == (0.1, 0.25)  # the lane's defaults
    assert (c.decode_tolerance, c.ttft_tolerance) == (0.6, 20.0)  # group_data/bed.py
    assert (c.max_tokens, c.runs, c.pp, c.tg) == (16, 3, 64, 16) and c.lane == "sim" and c.served_model == "tiny"
