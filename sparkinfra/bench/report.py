"""
A bench run's files under ``<root>/<cluster>/<lane>/<timestamp>/``: ``results.json`` (meta + raw),
``results.md`` (the seeds' tables) and PNG plots; ``compare`` diffs two runs.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path

from .benchy import Row
from .probes import THINKING_LABELS, WORKLOADS

# Results
# -------


@dataclass
class Meta:
    """What a run was measured on; ``timestamp`` is UTC ISO-8601 (``2026-07-05T10:15:00Z``)."""

    cluster: str
    lane: str
    image_id: str = ""
    model: str = ""
    model_revision: str = ""
    nccl_version: str = ""
    gmu: float | None = None
    timestamp: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> Meta:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def run_dir(root: str | Path, meta: Meta) -> Path:
    """``<root>/<cluster>/<lane>/<timestamp>`` (timestamp without separators: ``20260705T101500Z``)."""
    stamp = re.sub(r"[^0-9A-Za-z]", "", meta.timestamp)
    return Path(root) / meta.cluster / meta.lane / stamp


def _rate(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}{unit}"


def _seconds(ms: float | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.2f} s"


def _depth(depth: int) -> str:
    return f"{depth // 1024}k" if depth and depth % 1024 == 0 else str(depth)


def _probe_stats(probes: list[dict]) -> dict[tuple, list[float]]:
    stats: dict[tuple, list[float]] = {}
    for p in probes:
        if not p.get("warmup") and p.get("decode_tps") is not None:
            stats.setdefault((p["workload"], p["thinking"]), []).append(p["decode_tps"])
    return stats


def _table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(r) + " |" for r in [header, sep, *rows]]


def render_markdown(meta: Meta, probes: list[dict], rows: list[Row]) -> str:
    """``results.md``: the run's meta, then the seeds' tables (probes; depth sweeps; users)."""
    out = [f"# {meta.cluster} / {meta.lane} — {meta.timestamp}", ""]
    facts = [
        ("lane", meta.lane), ("image", meta.image_id), ("model", meta.model),
        ("model revision", meta.model_revision), ("NCCL", meta.nccl_version),
        ("gpu_memory_utilization", "" if meta.gmu is None else f"{meta.gmu:g}"),
        *((k, str(v)) for k, v in meta.extra.items()),
    ]
    out += _table(["field", "value"], [[k, f"`{v}`" if v else "—"] for k, v in facts], ["l", "l"]) + [""]

    stats = _probe_stats(probes)
    if stats:
        modes = [t for t in (False, True, None) if any(k[1] is t for k in stats)]
        workloads = [w for w in WORKLOADS if any(k[0] == w for k in stats)]
        workloads += sorted({k[0] for k in stats} - set(workloads))
        max_tokens = sorted({p.get("max_tokens") for p in probes if not p.get("warmup")} - {None})
        out += [
            "## Probes",
            "",
            f"{'/'.join(map(str, max_tokens)) or '256'}-token probes, temperature 0, single stream, warm engine; "
            "decode tok/s = completion_tokens / wall, mean (min–max, n).",
            "",
        ]
        body = []
        for w in workloads:
            cells = [w.upper() if w == "json" else w]
            for t in modes:
                v = stats.get((w, t))
                cells.append(f"{statistics.mean(v):.1f} ({min(v):.1f}–{max(v):.1f}, {len(v)})" if v else "—")
            body.append(cells)
        out += _table(["workload", *(THINKING_LABELS[t] for t in modes)], body, ["l", *"r" * len(modes)]) + [""]

    std = [r for r in rows if r.phase == "std"]
    shapes = sorted({(r.pp, r.tg) for r in std})
    for pp, tg in shapes:
        shape = [r for r in std if (r.pp, r.tg) == (pp, tg)]
        depths = sorted({r.depth for r in shape})
        users = sorted({r.concurrency for r in shape})
        for c in users if len(depths) > 1 or len(users) == 1 else []:
            sel = sorted((r for r in shape if r.concurrency == c), key=lambda r: r.depth)
            who = "1 user" if c == 1 else f"{c} users"
            out += [f"## Depth sweep: pp{pp} / tg{tg}, {who} (llama-benchy)", ""]
            header = ["depth", "prefill (PP)", "decode (TG)"] + (["decode per user"] if c > 1 else []) + ["TTFT"]
            body = [
                [_depth(r.depth), _rate(r.pp_tps, 0, " tok/s"), _rate(r.tg_tps, 1, " tok/s")]
                + ([_rate(r.tg_req_tps, 1, " tok/s")] if c > 1 else []) + [_seconds(r.e2e_ttft_ms)]
                for r in sel
            ]
            out += _table(header, body, ["l"] + ["r"] * (len(header) - 1)) + [""]
        if len(users) > 1:  # like the users plot: at the shape's lowest depth
            d = depths[0]
            sel = sorted((r for r in shape if r.depth == d), key=lambda r: r.concurrency)
            out += [f"## Users: pp{pp} / tg{tg} at depth {_depth(d)} (llama-benchy)", ""]
            header = ["users", "agg tok/s", "per-user tok/s", "prefill tok/s", "TTFT"]
            body = [
                [str(r.concurrency), _rate(r.tg_tps), _rate(r.tg_req_tps), _rate(r.pp_tps, 0),
                 _seconds(r.e2e_ttft_ms)]
                for r in sel
            ]
            out += _table(header, body, ["l", "r", "r", "r", "r"]) + [""]
    if any(r.pp_tps is None for r in std):
        out += [
            "— as prefill: llama-benchy reports no prefill rate when the time to the first token was not "
            "above its measured round-trip latency (a prompt too short to time on this engine).",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def _figure(title: str, xlabel: str, ylabel: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _decode_plot(rows: list[Row], title: str, xlabel: str, ylabel: str, x, tick_label, draw, legend_title=None):
    """
    A figure of decode rates (the sweep's rows that have one) against ``x(row)``, each (pp, tg)
    shape drawn by ``draw(ax, shape_rows, suffix)`` (``suffix`` names the shape when there are
    several); None without such rows.
    """
    std = [r for r in rows if r.phase == "std" and r.tg_tps is not None]
    if not std:
        return None
    fig, ax = _figure(title, xlabel, ylabel)
    shapes = sorted({(r.pp, r.tg) for r in std})
    for pp, tg in shapes:
        draw(ax, [r for r in std if (r.pp, r.tg) == (pp, tg)], f"pp{pp}/tg{tg}" if len(shapes) > 1 else "")
    ticks = sorted({x(r) for r in std})
    ax.set_xticks(ticks, labels=[tick_label(t) for t in ticks])
    ax.set_ylim(bottom=0)
    ax.legend(title=legend_title)
    return fig


def plot_decode_vs_depth(rows: list[Row], title: str = ""):
    """Figure: decode tok/s (all users) against context depth, one line per concurrency (and shape)."""

    def draw(ax, shape: list[Row], suffix: str) -> None:
        for c in sorted({r.concurrency for r in shape}):
            sel = sorted((r for r in shape if r.concurrency == c), key=lambda r: r.depth)
            label = f"{c} user{'s' if c > 1 else ''}" + (f", {suffix}" if suffix else "")
            ax.plot([r.depth for r in sel], [r.tg_tps for r in sel], marker="o", label=label)

    return _decode_plot(rows, "Decode throughput vs context depth" + (f" — {title}" if title else ""),
                        "context depth (tokens)", "decode tok/s (all users)",
                        lambda r: r.depth, _depth, draw, legend_title="concurrency")


def plot_users(rows: list[Row], title: str = ""):
    """Figure: aggregate and per-user decode tok/s against concurrent users, at each shape's lowest depth."""

    def draw(ax, shape: list[Row], _suffix: str) -> None:
        pp, tg, depth = shape[0].pp, shape[0].tg, min(r.depth for r in shape)
        sel = sorted((r for r in shape if r.depth == depth), key=lambda r: r.concurrency)
        named = f" (pp{pp}/tg{tg}, depth {_depth(depth)})"
        users = [r.concurrency for r in sel]
        ax.plot(users, [r.tg_tps for r in sel], marker="o", label="aggregate" + named)
        ax.plot(users, [r.tg_req_tps or r.tg_tps for r in sel], marker="s", linestyle="--", label="per user" + named)

    return _decode_plot(rows, "Decode throughput vs concurrent users" + (f" — {title}" if title else ""),
                        "concurrent users", "decode tok/s", lambda r: r.concurrency, str, draw)


def write_results(
    root: str | Path, meta: Meta, probes: list[dict], sweep: list[Row], *, benchy_raw: dict | None = None
) -> Path:
    """
    Write a run under ``run_dir(root, meta)``: ``results.json`` (meta, probes, sweep rows, the raw
    llama-benchy report), ``results.md``, and ``decode_vs_depth.png`` / ``users.png`` when there is
    a sweep. Returns the run's folder.
    """
    folder = run_dir(root, meta)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": asdict(meta),
        "probes": probes,
        "sweep": [asdict(r) for r in sweep],
        "benchy_raw": benchy_raw,
    }
    (folder / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    (folder / "results.md").write_text(render_markdown(meta, probes, sweep))
    title = f"{meta.cluster}/{meta.lane}"
    for name, plot in (("decode_vs_depth.png", plot_decode_vs_depth), ("users.png", plot_users)):
        fig = plot(sweep, title)
        if fig is not None:
            fig.savefig(folder / name, dpi=120)
    return folder


def load_results(folder: str | Path) -> tuple[Meta, list[dict], list[Row]]:
    """A run written by ``write_results``."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {folder}")
    data = json.loads(path.read_text())
    rows = [Row(**r) for r in data.get("sweep") or []]
    return Meta.from_dict(data["meta"]), data.get("probes") or [], rows


def _delta(a: float | None, b: float | None, digits: int = 1) -> list[str]:
    if a is None or b is None:
        return [_rate(a, digits), _rate(b, digits), "—", "—"]
    pct = f"{(b - a) / a * 100:+.1f}%" if a else "—"
    return [f"{a:.{digits}f}", f"{b:.{digits}f}", f"{b - a:+.{digits}f}", pct]


def compare(a_dir: str | Path, b_dir: str | Path) -> str:
    """Two runs side by side: what differs in their meta, then every shared row's throughput, B vs A."""
    (ma, pa, ra), (mb, pb, rb) = load_results(a_dir), load_results(b_dir)
    out = [f"A: {a_dir}", f"B: {b_dir}", ""]

    da, db = asdict(ma), asdict(mb)
    extra_a, extra_b = da.pop("extra"), db.pop("extra")
    da.update({f"extra.{k}": v for k, v in extra_a.items()})
    db.update({f"extra.{k}": v for k, v in extra_b.items()})
    keys = dict.fromkeys([*da, *db])
    changed = [[k, f"`{da.get(k)}`", f"`{db.get(k)}`"] for k in keys if da.get(k) != db.get(k)]
    out += ["## Meta", ""]
    out += _table(["field", "A", "B"], changed, ["l", "l", "l"]) if changed else ["(same)"]
    out.append("")

    sa, sb = _probe_stats(pa), _probe_stats(pb)
    if sa or sb:
        body = []
        for key in dict.fromkeys([*sa, *sb]):
            name = f"{key[0]}, {THINKING_LABELS.get(key[1], key[1])}"
            mean_a = statistics.mean(sa[key]) if key in sa else None
            mean_b = statistics.mean(sb[key]) if key in sb else None
            body.append([name, *_delta(mean_a, mean_b)])
        out += ["## Probes (decode tok/s, mean)", ""]
        out += _table(["probe", "A", "B", "Δ", "Δ %"], body, ["l", "r", "r", "r", "r"]) + [""]

    ka, kb = {r.key: r for r in ra}, {r.key: r for r in rb}
    if ka or kb:
        body = []
        for key in sorted(set(ka) & set(kb)):
            a, b = ka[key], kb[key]
            body.append([a.label, "decode tok/s", *_delta(a.tg_tps, b.tg_tps)])
            if a.concurrency > 1:
                body.append([a.label, "decode tok/s per user", *_delta(a.tg_req_tps, b.tg_req_tps)])
            body.append([a.label, "prefill tok/s", *_delta(a.pp_tps, b.pp_tps, 0)])
            body.append([a.label, "TTFT ms", *_delta(a.e2e_ttft_ms, b.e2e_ttft_ms, 0)])
        out += ["## Sweep (llama-benchy)", ""]
        out += _table(["row", "metric", "A", "B", "Δ", "Δ %"], body, ["l", "l", "r", "r", "r", "r"]) + [""]
        for side, only in (("A", set(ka) - set(kb)), ("B", set(kb) - set(ka))):
            if only:
                labels = ", ".join((ka if side == "A" else kb)[k].label for k in sorted(only))
                out += [f"Only in {side}: {labels}", ""]
    return "\n".join(out).rstrip() + "\n"
