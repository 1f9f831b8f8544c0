"""One PNG per comparison: KV usage and prefix hit rate over time, and the TTFT distribution,
one line per configuration. The only simulator module that writes (the image file)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.simulator.metrics import SimResult

# matplotlib is the plot extra: a planning install (pip install kvtune) leaves its ~40 MB out.
PLOT_EXTRA_MISSING = ("needs matplotlib, which the core install leaves out: "
                      "pip install 'kvtune[plot]'")

_MAX_POINTS = 1500
_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))


def _thin(t: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    ta = np.asarray(t, dtype=float)
    ya = np.asarray(y, dtype=float)
    if ta.size > _MAX_POINTS:
        idx = np.linspace(0, ta.size - 1, _MAX_POINTS).astype(int)
        ta, ya = ta[idx], ya[idx]
    return ta, ya


def matplotlib_installed() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_comparison(results: Sequence[SimResult], path: str | Path, title: str = "") -> Path:
    if not matplotlib_installed():
        raise KVTuneError(f"plotting {path} {PLOT_EXTRA_MISSING}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 11), constrained_layout=True)
    ax_kv, ax_hit, ax_ttft = axes
    any_hits = False
    for i, r in enumerate(results):
        # Distinct dashes: configurations that behave the same draw on top of each other.
        style = {"label": r.name, "linestyle": _STYLES[i % len(_STYLES)]}
        t, kv = _thin(r.series.time_seconds, r.series.kv_usage)
        ax_kv.plot(t / 60.0, kv * 100.0, linewidth=0.9, **style)
        t, hit = _thin(r.series.time_seconds, r.series.prefix_hit_rate)
        any_hits = any_hits or bool(hit.size and hit.max() > 0)
        ax_hit.plot(t / 60.0, hit * 100.0, linewidth=1.4, **style)
        ttft = np.sort(r.ttft_seconds())
        if ttft.size:
            cdf = np.arange(1, ttft.size + 1) / ttft.size
            ax_ttft.plot(np.maximum(ttft, 1e-3), cdf * 100.0, linewidth=1.4, **style)
    if not any_hits:
        ax_hit.text(0.5, 0.5, "no prefix-cache hits in any configuration\n"
                    "(the trace shares no prefixes, or caching is off)",
                    transform=ax_hit.transAxes, ha="center", va="center", color="grey")
    ax_kv.set_title("KV-cache usage (blocks held, % of the cache)")
    ax_kv.set_xlabel("simulated time (minutes)")
    ax_kv.set_ylabel("KV usage %")
    ax_kv.set_ylim(0, 102)
    ax_hit.set_title("Prefix-cache hit rate (tokens, cumulative)")
    ax_hit.set_xlabel("simulated time (minutes)")
    ax_hit.set_ylabel("hit rate %")
    ax_hit.set_ylim(0, 100)
    ax_ttft.set_title("Time to first token (CDF over requests)")
    ax_ttft.set_xscale("log")
    ax_ttft.set_xlabel("TTFT (seconds, log scale)")
    ax_ttft.set_ylabel("% of requests")
    ax_ttft.axhline(95, color="grey", linewidth=0.6, linestyle="--")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=9)
    if title:
        fig.suptitle(title)
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
