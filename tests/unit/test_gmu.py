"""
``sparkinfra.gmu``: vLLM start-up logs -> outcomes (every fixture under ``fixtures/vllm_logs``),
and the bracketing arithmetic against simulated starts that print vLLM's own messages: seed 001's
GB10 pair (0.93 short by 0.02 GiB, 0.925 too small a pool, 0.929 boots) and the CPU build's
``VLLM_CPU_KVCACHE_SPACE``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from sparkinfra import vllm_log
from sparkinfra.gmu import CPU_KV_SPACE, GMU, Knob, bracket, next_value, suggestion_text
from sparkinfra.vllm_log import Outcome, parse_startup

LOGS = Path(__file__).parent / "fixtures" / "vllm_logs"
GIB = 1 << 30
LANE_A = 196_608  # seed 001, lane A: max_model_len


def log(name: str) -> str:
    return (LOGS / name).read_text()


# The parser on every fixture
# ---------------------------

EXPECTED = {
    "seed001_v0.22.1_gmu0.930_too_high.log": dict(
        kind="too_high", gmu=0.93, shortfall_gib=0.02, free_gib=113.1, total_gib=121.63, requested_gib=113.12,
        version="0.22.1", evidence="Free memory on device cuda:0 (113.1/121.63 GiB)"),
    "seed001_v0.22.1_gmu0.925_autofit_pool_too_small.log": dict(
        kind="ok", gmu=0.925, kv_tokens=196_224, max_model_len=196_096, kv_available_gib=8.13,
        evidence="Auto-fit max_model_len: reduced from 1048576 to 196096"),
    "seed001_v0.22.1_gmu0.929_ok.log": dict(
        kind="ok", gmu=0.929, kv_tokens=208_128, max_model_len=LANE_A, kv_available_gib=8.62,
        evidence="GPU KV cache size: 208,128 tokens"),
    "v0.22.1+v0.23.0_too_low.log": dict(
        kind="too_low", gmu=0.9, needed_tokens=LANE_A, max_model_len=LANE_A, kv_needed_gib=8.14,
        kv_available_gib=5.1, shortfall_gib=3.04, kv_tokens=123_136,
        evidence="To serve at least one request with the model's max seq len (196608)"),
    "v0.22.1+v0.23.0_no_cache_memory.log": dict(
        kind="too_low", gmu=0.8, kv_available_gib=-7.07, kv_tokens=0,
        evidence="No available memory for the cache blocks"),
    "v0.21.0_too_low_color.log": dict(
        kind="too_low", gmu=0.55, needed_tokens=131_072, kv_needed_gib=32.0, kv_available_gib=10.91,
        kv_tokens=44_688, version="0.21.0", evidence="with the models's max seq len (131072)"),
    "v0.9.1_too_high_no_device.log": dict(
        kind="too_high", gmu=0.95, free_gib=31.44, total_gib=47.38, requested_gib=45.01, shortfall_gib=13.57,
        version="0.9.1", evidence="Free memory on device (31.44/47.38 GiB)"),
    "v0.8-v0.10_V0engine_too_low.log": dict(
        kind="too_low", needed_tokens=131_072, max_model_len=131_072, kv_tokens=93_760, version="0.8.5",
        evidence="stored in KV cache (93760)"),
    "v0.32.0_gpu_ok_memory_report.log": dict(  # the success report's "Free memory on device ... on startup." is no shortfall
        kind="ok", gmu=0.929, kv_tokens=198_272, max_model_len=LANE_A, kv_available_gib=8.21, version="0.32.0",
        shortfall_gib=None, evidence="GPU KV cache size: 198,272 tokens"),
    "v0.32.0_cpu_kvspace_ok.log": dict(
        kind="ok", kv_tokens=2_097_152, kv_available_gib=1.0, total_gib=23.41, version="0.32.0",
        evidence="CPU KV cache size: 2,097,152 tokens"),
    "v0.32.0_cpu_kvspace_too_low.log": dict(
        kind="too_low", needed_tokens=4_194_304, kv_needed_gib=2.0, kv_available_gib=1.0, kv_tokens=2_097_024,
        total_gib=23.41, evidence="max seq len (4194304)"),
    "v0.32.0_cpu_kvspace_too_high.log": dict(
        kind="too_high", gmu=None, free_gib=17.82, total_gib=23.41, requested_gib=64.0, shortfall_gib=46.18,
        evidence="on kv cache allocation is less than requested memory for kv (64.0 GiB)"),
    "v0.32.0_cpu_gmu_too_high.log": dict(
        kind="too_high", gmu=0.9, free_gib=17.82, total_gib=23.41, requested_gib=21.07, shortfall_gib=3.25,
        evidence="desired CPU memory utilization (0.9, 21.07 GiB)"),
    "v0.32.0_gpu_too_high_external_weights.log": dict(
        kind="too_high", gmu=0.93, free_gib=8.4, requested_gib=8.91, shortfall_gib=0.51,
        evidence="engine's budget after excluding external process's weights"),
    "v0.22.1_other_failure_b12x.log": dict(
        kind="other_failure", evidence="TypeError: B12XPagedAttentionScratchCaps.__init__()"),
    "v0.22.1_incomplete_loading.log": dict(
        kind="incomplete", evidence="Loading safetensors checkpoint shards:  42%"),
}


def test_every_fixture_has_expectations():
    assert sorted(EXPECTED) == sorted(p.name for p in LOGS.glob("*.log"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_fixture(name):
    want = dict(EXPECTED[name])
    evidence = want.pop("evidence")
    text = log(name)
    outcome = parse_startup(text)
    for key, value in want.items():
        assert getattr(outcome, key) == value, key
    assert any(evidence in line for line in outcome.evidence), outcome.evidence
    # Evidence lines are lines of the log (colour codes removed), each given once.
    raw = {vllm_log._clean(line) for line in text.splitlines()}
    assert outcome.evidence and all(line in raw for line in outcome.evidence)
    assert len(set(outcome.evidence)) == len(outcome.evidence)
    assert not any("\x1b" in line for line in outcome.evidence)


def test_worst_rank_decides_and_each_message_counts_once():
    head = log("seed001_v0.22.1_gmu0.930_too_high.log")
    worker = head.replace("(113.1/121.63 GiB)", "(112.8/121.63 GiB)").replace("pid=298", "pid=377")
    outcome = parse_startup(head + worker)
    assert outcome.kind == "too_high" and outcome.shortfall_gib == 0.32 and outcome.free_gib == 112.8
    assert len(outcome.evidence) == 2


def test_startup_complete_without_pool_line_uses_concurrency():
    text = (
        "(EngineCore pid=3) INFO 12-02 10:00:00 [kv_cache_utils.py:1735] Maximum concurrency for 2,048 tokens "
        "per request: 3.50x\n(APIServer pid=1) INFO:     Application startup complete.\n"
    )
    assert parse_startup(text).kv_tokens == 7168


def test_empty_log_is_incomplete():
    assert parse_startup("").kind == "incomplete"


def test_pool_tokens_estimated_from_memory():
    o = Outcome("too_low", needed_tokens=100_000, kv_needed_gib=4.0, kv_available_gib=3.0)
    assert o.pool_tokens() == 75_000


# Simulated starts that print vLLM 0.22's messages
# ------------------------------------------------


def line(level: str, src: str, msg: str, proc: str = "EngineCore pid=212") -> str:
    return f"({proc}) {level} 07-05 10:00:00 [{src}] {msg}"


@dataclasses.dataclass
class Pair:
    """One rank of seed 001's GB10 pair: what vLLM 0.22.1 would print for a given GMU."""

    total: float = 121.63
    free: float = 113.10
    non_kv: float = 104.37
    bytes_per_token: int = 44_472
    block: int = 128
    max_len: int = LANE_A
    auto_fit: bool = False
    starts: list = dataclasses.field(default_factory=list)

    def __call__(self, value: float) -> Outcome:
        self.starts.append(value)
        return parse_startup(self.log(value))

    def log(self, value: float) -> str:
        total, free = self.total * GIB, self.free * GIB
        requested = math.ceil(total * value)
        out = [line("INFO", "utils.py:278", f"non-default args: {{'gpu_memory_utilization': {value}}}", "APIServer pid=1")]
        if free < requested:
            out.append(line(
                "ERROR", "multiproc_executor.py:870",
                f"ValueError: Free memory on device cuda:0 ({round(free / GIB, 2)}/{round(total / GIB, 2)} GiB) on "
                f"startup is less than desired GPU memory utilization ({value}, {round(requested / GIB, 2)} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes.", "Worker_TP0 pid=298"))
            return "\n".join(out)
        kv = requested - self.non_kv * GIB
        out.append(line("INFO", "gpu_worker.py:466", f"Available KV cache memory: {round(kv / GIB, 2)} GiB",
                        "Worker_TP0 pid=298"))
        if kv <= 0:
            out.append(line("ERROR", "core.py:1165", "ValueError: No available memory for the cache blocks. Try "
                            "increasing `gpu_memory_utilization` when initializing the engine."))
            return "\n".join(out)
        blocks = int(kv // (self.bytes_per_token * self.block))
        tokens, needed = blocks * self.block, self.max_len * self.bytes_per_token
        max_len = self.max_len
        if kv < needed:
            if not self.auto_fit:
                out.append(line(
                    "ERROR", "core.py:1165",
                    f"ValueError: To serve at least one request with the model's max seq len ({self.max_len}), "
                    f"({round(needed / GIB, 2)} GiB KV cache is needed, which is larger than the available KV "
                    f"cache memory ({round(kv / GIB, 2)} GiB). Based on the available memory, the estimated "
                    f"maximum model length is {tokens - self.block}. Try increasing `gpu_memory_utilization`."))
                return "\n".join(out)
            max_len = tokens - self.block
            out.append(line("INFO", "kv_cache_utils.py:1895", f"Auto-fit max_model_len: reduced from 1048576 to "
                            f"{max_len} to fit in available GPU memory ({round(kv / GIB, 2)} GiB available for KV cache)"))
        out += [
            line("INFO", "kv_cache_utils.py:1733", f"GPU KV cache size: {tokens:,} tokens"),
            line("INFO", "kv_cache_utils.py:1734", f"Maximum concurrency for {max_len:,} tokens per request: "
                 f"{tokens / max_len:.2f}x"),
            "(APIServer pid=1) INFO:     Application startup complete.",
        ]
        return "\n".join(out)


def test_simulated_pair_matches_the_seed():
    pair = Pair()
    assert pair(0.93).shortfall_gib == 0.02
    assert pair(0.929).kv_tokens == 208_128
    assert pair(0.925).kind == "too_low" and pair(0.925).pool_tokens() < LANE_A
    assert Pair(auto_fit=True)(0.925).kind == "ok" and Pair(auto_fit=True)(0.925).kv_tokens < LANE_A


@pytest.mark.parametrize("start", [0.95, 0.80, 0.925, 0.90, 0.94, 0.929])
@pytest.mark.parametrize("auto_fit", [False, True])
def test_bracket_finds_seed_value(start, auto_fit):
    pair = Pair(auto_fit=auto_fit)
    result = bracket(GMU, start, pair, LANE_A)
    assert result.status == "bracketed"
    assert result.value == pytest.approx(0.929, abs=GMU.resolution)
    assert result.upper - result.value == pytest.approx(GMU.resolution)
    assert result.starts <= 4 and result.starts == len(pair.starts)
    assert pair.starts[0] == start


def test_bracket_from_too_high_is_three_starts():
    pair = Pair()
    result = bracket(GMU, 0.95, pair, LANE_A)
    assert pair.starts == [0.95, 0.929, 0.93]
    assert result.value == 0.929 and result.upper == 0.93
    assert any("GPU KV cache size: 208,128 tokens" in e for e in result.evidence)
    assert any("(113.1/121.63 GiB)" in e for e in result.evidence)


def test_bracket_from_deliberately_low_start():
    pair = Pair()
    result = bracket(GMU, 0.80, pair, LANE_A)
    assert pair.starts == [0.80, GMU.hi, 0.929, 0.93]  # the top fails in seconds and names the edge
    assert result.history[0][1].kind == "too_low"


def test_bracket_reports_when_no_value_holds_the_pool():
    pair = Pair()
    result = bracket(GMU, 0.95, pair, 250_000)
    assert result.status == "infeasible" and result.value is None
    assert result.starts <= 3
    text = suggestion_text(result, "pair-a", "balanced")
    assert text.startswith("# gpu_memory_utilization: no value boots with a 250,000-token KV pool")


def test_bracket_stops_on_another_failure():
    result = bracket(GMU, 0.929, lambda v: parse_startup(log("v0.22.1_other_failure_b12x.log")), LANE_A)
    assert result.status == "stopped" and result.starts == 1 and result.value is None
    assert any("B12XPagedAttentionScratchCaps" in e for e in result.evidence)
    assert "ended other failure" in suggestion_text(result, "pair-a", "balanced")


def test_bracket_respects_max_starts():
    result = bracket(GMU, 0.80, Pair(), LANE_A, max_starts=2)
    assert result.status == "max_starts" and result.starts == 2


def test_suggestion_text_for_the_seed():
    result = bracket(GMU, 0.95, Pair(), LANE_A)
    text = suggestion_text(result, "pair-a", "balanced")
    first = text.splitlines()[0]
    assert first.startswith("gpu_memory_utilization = 0.929  # cluster pair-a, lane balanced: ")
    assert "208,128-token KV pool (>= 196,608 needed)" in first
    assert "0.930 fails the start-up free-memory check (short by 0.02 GiB)" in first
    assert "# starts (3): 0.950 too_high, 0.929 ok, 0.930 too_high" in text
    assert "#   (EngineCore pid=212) INFO 07-05 10:00:00 [kv_cache_utils.py:1733] GPU KV cache size: 208,128 tokens" in text


# next_value arithmetic
# ---------------------


def high(value: float, free: float, total: float) -> Outcome:
    requested = round(total * value, 2)
    return Outcome("too_high", free_gib=free, total_gib=total, requested_gib=requested,
                   shortfall_gib=round(requested - free, 2))


def test_too_high_steps_down_by_shortfall_over_total_plus_margin():
    # 0.95 of 121.63 GiB is 115.55 GiB; 113.10 free: 2.45 GiB short = 0.0201 of total, less the margin.
    assert next_value(GMU, [(0.95, high(0.95, 113.10, 121.63))], LANE_A) == 0.929


def test_good_below_predicted_edge_confirms_one_step_up():
    history = [(0.95, high(0.95, 113.10, 121.63)), (0.929, Outcome("ok", kv_tokens=208_128))]
    assert next_value(GMU, history, LANE_A) == 0.93
    history.append((0.93, high(0.93, 113.10, 121.63)))
    assert next_value(GMU, history, LANE_A) is None


def test_too_low_scales_proportionally_capped_by_known_bad():
    knob = Knob("k", "fraction", lo=0.1, hi=0.98, resolution=0.001)
    # A too-high start without numbers: bisect between the proportional need and the known bad value.
    history = [(0.5, Outcome("too_low", kv_tokens=50_000)), (0.9, Outcome("too_high"))]
    assert next_value(knob, history, 80_000) == 0.85  # need 0.8, upper 0.9
    # A need beyond the known-bad value is capped: plain bisection below it.
    history = [(0.5, Outcome("too_low", kv_tokens=40_000)), (0.9, Outcome("too_high"))]
    assert next_value(knob, history, 80_000) == 0.7


def test_ok_with_pool_too_small_counts_as_too_low():
    history = [(0.925, Outcome("ok", kv_tokens=196_224))]
    assert next_value(GMU, history, LANE_A) == GMU.hi
    assert next_value(GMU, history, 190_000) == GMU.hi  # good, but the edge is still unknown


def test_top_of_range_that_boots_is_done():
    assert next_value(GMU, [(GMU.hi, Outcome("ok", kv_tokens=300_000))], LANE_A) is None


def test_other_failure_or_incomplete_ends():
    assert next_value(GMU, [(0.9, Outcome("other_failure"))], LANE_A) is None
    assert next_value(GMU, [(0.9, Outcome("incomplete"))], LANE_A) is None
    with pytest.raises(ValueError):
        next_value(GMU, [], LANE_A)


# The CPU build's KV-space knob
# -----------------------------


@dataclasses.dataclass
class CpuNode:
    """The bed's CPU build (0.32) with ``VLLM_CPU_KVCACHE_SPACE`` = value: what it prints."""

    total: float = 23.41
    available: float = 17.82
    bytes_per_token: int = 512
    block: int = 128
    max_len: int = 4_194_304
    starts: list = dataclasses.field(default_factory=list)

    def __call__(self, value: float) -> Outcome:
        self.starts.append(value)
        assert value == int(value), "VLLM_CPU_KVCACHE_SPACE is read with int()"
        p = "Worker_TP0 pid=77"
        if value > self.available:
            return parse_startup(line(
                "ERROR", "multiproc_executor.py:953",
                f"ValueError: Available memory on node 0 ({self.available}/{self.total} GiB) on kv cache allocation "
                f"is less than requested memory for kv ({float(value)} GiB). Decrease --kv-cache-memory-bytes, "
                "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.", p))
        kv = value * GIB
        out = [line("INFO", "cpu_worker.py:260", f"Explicitly set ({float(value)}/{self.total}) GiB for KV cache on node 0.", p)]
        tokens = int(kv // (self.bytes_per_token * self.block)) * self.block
        needed = self.max_len * self.bytes_per_token
        if kv < needed:
            out.append(line(
                "ERROR", "core.py:1510",
                f"ValueError: To serve at least one request with the model's max seq len ({self.max_len}), "
                f"({round(needed / GIB, 2)} GiB KV cache is needed, which is larger than the available KV cache "
                f"memory ({round(kv / GIB, 2)} GiB). Based on the available memory, the estimated maximum model "
                f"length is {tokens - self.block}. Try increasing `gpu_memory_utilization`."))
        else:
            out += [line("INFO", "kv_cache_utils.py:2327", f"CPU KV cache size: {tokens:,} tokens, Maximum "
                         f"concurrency for {self.max_len:,} tokens per request: {tokens / self.max_len:.2f}x"),
                    "(APIServer pid=1) INFO:     Application startup complete."]
        return parse_startup("\n".join(out))


def test_cpu_kv_knob_is_whole_gib():
    assert CPU_KV_SPACE.resolution == 1 and CPU_KV_SPACE.unit == "GiB"
    assert CPU_KV_SPACE.snap(17.32, "down") == 17 and CPU_KV_SPACE.format(17) == "17"
    assert GMU.snap(0.92936, "down") == 0.929 and GMU.format(0.93) == "0.930"


def test_cpu_kv_knob_brackets_the_edge():
    node = CpuNode()
    knob = dataclasses.replace(CPU_KV_SPACE, hi=64)
    result = bracket(knob, 1, node, node.max_len)
    assert node.starts == [1, 64, 17, 18]
    assert result.status == "bracketed" and result.value == 17 and result.upper == 18
    text = suggestion_text(result, "sim", "tiny")
    assert text.startswith('lane_env = {"VLLM_CPU_KVCACHE_SPACE": "17"}  '
                           '# cluster sim, lane tiny: 17 boots with a 35,651,584-token KV pool')


def test_cpu_kv_knob_top_of_allowed_range():
    node = CpuNode()
    result = bracket(CPU_KV_SPACE, 1, node, node.max_len)
    assert node.starts == [1, CPU_KV_SPACE.hi] and result.status == "top_of_range" and result.value == 16
    assert suggestion_text(result, "sim", "tiny").startswith(
        'lane_env = {"VLLM_CPU_KVCACHE_SPACE": "16"}  # cluster sim, lane tiny:')


def test_cpu_kv_knob_too_small_for_the_length():
    node = CpuNode(available=1.5)
    result = bracket(CPU_KV_SPACE, 1, node, node.max_len)
    assert result.status == "infeasible" and result.starts <= 3
