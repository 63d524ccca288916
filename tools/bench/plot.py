#!/usr/bin/env python3
"""Plots for tools/bench.sh (needs matplotlib; bench.sh calls it only when that imports).

    plot.py BENCH_DIR

Reads BENCH_DIR/results.txt (key=value lines) and the perftest -a sweeps
BENCH_DIR/sweep-{write,read,send}_bw.log, and writes:
  bandwidth.png  BW average (GB/s) against message size, 2 B to 8 MiB, for ib_write_bw,
                 ib_read_bw and ib_send_bw, with the UDP GSO+GRO and TCP baselines as lines
  latency.png    latency percentiles (min, median, p99, p99.9) of ib_send_lat, ib_write_lat
                 and ib_read_lat (8 B) next to the raw UDP half round trip
"""
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogLocator, ScalarFormatter  # noqa: E402


def read_results(path):
    res = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if not sep:
                continue
            try:
                res[key] = float(value)
            except ValueError:
                pass  # "timeout", "failed (...)", empty
    return res


def read_sweep(path):
    """(bytes, MiB/s) rows of a perftest -a report (the result rows under its #bytes header)."""
    rows = []
    if not os.path.exists(path):
        return rows
    col = None
    with open(path) as f:
        for line in f:
            if "#bytes" in line:
                # "BW average[MB/sec]" is the 4th column: #bytes #iterations peak average.
                col = 3
                continue
            if col is not None and re.match(r"^\s*\d+\s+\d+\s", line):
                fields = line.split()
                try:
                    rows.append((int(fields[0]), float(fields[col])))
                except (IndexError, ValueError):
                    pass
    return rows


def plot_bandwidth(bench, res):
    fig, ax = plt.subplots(figsize=(8, 5))
    drew = False
    for tool in ("write_bw", "read_bw", "send_bw"):
        rows = read_sweep(os.path.join(bench, f"sweep-{tool}.log"))
        if not rows:
            continue
        sizes = [r[0] for r in rows]
        gbs = [r[1] * 1048576 / 1e9 for r in rows]  # perftest's MB/sec is MiB/s
        ax.plot(sizes, gbs, marker="o", markersize=3, label=f"uroce ib_{tool}")
        drew = True
    for key, label, style in (
        ("base_gso_goodput_Bps", "raw UDP GSO+GRO (4112 B segments)", "--"),
        ("base_tcp_goodput_Bps", "TCP, one stream (64 KiB writes)", ":"),
    ):
        if key in res:
            ax.axhline(res[key] / 1e9, linestyle=style, color="grey", label=label)
    if not drew:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s (10^9 bytes/s), log scale")
    ax.set_title("uroce bandwidth against message size (perftest -a), loopback")
    ax.grid(True, which="both", alpha=0.3)
    return save(fig, ax, bench, "bandwidth.png")


def save(fig, ax, bench, name):
    """Adds the legend, writes BENCH/NAME, closes the figure; returns the path."""
    ax.legend()
    out = os.path.join(bench, name)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_latency(bench, res):
    series = []
    for tool in ("send_lat", "write_lat", "read_lat"):
        keys = [f"{tool}_t_min", f"{tool}_t_typical", f"{tool}_99", f"{tool}_999"]
        if all(k in res for k in keys):
            series.append((f"uroce ib_{tool}", [res[k] for k in keys]))
    base = ["base_rtt_min_us", "base_rtt_p50_us", "base_rtt_p99_us", "base_rtt_p999_us"]
    if all(k in res for k in base):
        series.append(("raw UDP half RTT (busy poll)", [res[k] / 2 for k in base]))
    if not series:
        return None
    labels = ["min", "median", "p99", "p99.9"]
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)  # a log axis alone is hard to read off
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    top = max(v for _, values in series for v in values)
    ax.set_ylim(top=top * 1.5)  # room for the labels over the tallest bars
    ax.set_ylabel("microseconds (log scale)")
    ax.set_title("8-byte latency percentiles, loopback (perftest: one-way; READ: round trip)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    return save(fig, ax, bench, "latency.png")


def main():
    if len(sys.argv) != 2:
        print("usage: plot.py BENCH_DIR", file=sys.stderr)
        return 2
    bench = sys.argv[1]
    res = read_results(os.path.join(bench, "results.txt"))
    made = [p for p in (plot_bandwidth(bench, res), plot_latency(bench, res)) if p]
    if not made:
        print("plot.py: nothing to plot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
