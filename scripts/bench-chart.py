#!/usr/bin/env python3
"""Charts of a `scripts/bench-vs-etcd.sh` run (issue 20 part 8).

    scripts/bench-chart.py OUT/results.tsv [--out OUT/chart.png] [--curves OUT/latency-curves.png]
    scripts/bench-chart.py --self-test [--keep]

From results.tsv (the tab-separated rows of bench-vs-etcd.sh, header `generator members
workload server round rps p50_ms p99_ms p999_ms cpu_us_op errors`) it draws one PNG with a
row of four panels per (members, load generator): req/s, p50, p99 and p99.9 latency per
workload, one bar per server (each etcd version, then Keel), bar = median over rounds, whisker
= min-max. The title carries the date (from meta.txt beside results.tsv, else the file's
time) and the number of rounds.

With --curves it also draws latency-percentile curves from the `*.hgrm` files beside
results.tsv (keel-bench --hdr-out: HdrHistogram's percentile distribution text, values in
µs), one panel per (members, workload), one line per server, the last round of each.

matplotlib: if `import matplotlib` fails, the script makes a venv ($BENCH_CHART_VENV, default
~/.cache/keel-bench/venv-chart), pip-installs matplotlib into it and runs itself again with
that venv's python. If that fails it prints a warning and exits with status 3 (callers treat 3
as "no chart", not as an error).

--self-test writes a synthetic results.tsv, meta.txt and two .hgrm files to a temp dir,
draws both charts and checks that each PNG starts with the PNG signature and is larger than
20 KB; the temp dir is removed afterwards unless --keep.
"""

import collections
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

NO_MATPLOTLIB = 3
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COLUMNS = ["generator", "members", "workload", "server", "round", "rps", "p50_ms", "p99_ms",
           "p999_ms", "cpu_us_op", "errors", "gen_cpu_us_op"]
ORDER = ["put-c1", "put-c64", "put-c256", "range-l-c64", "range-s-c64"]
# etcd versions in blue/grey tones, Keel in orange.
ETCD_COLORS = ["#4c72b0", "#8c9fc9", "#2a3f66", "#a0a0a0"]
KEEL_COLOR = "#dd8452"


def ensure_matplotlib():
    """Imports matplotlib (Agg backend), installing it into a venv and re-running if needed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        return
    except ImportError:
        pass
    if os.environ.get("BENCH_CHART_REEXEC"):
        warn("matplotlib is still missing in the venv")
        sys.exit(NO_MATPLOTLIB)
    venv = os.environ.get("BENCH_CHART_VENV",
                          os.path.expanduser("~/.cache/keel-bench/venv-chart"))
    python = os.path.join(venv, "bin", "python")
    try:
        if not os.path.exists(python):
            print(f"bench-chart: creating a venv for matplotlib in {venv}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        if subprocess.run([python, "-c", "import matplotlib"], capture_output=True).returncode:
            print("bench-chart: pip install matplotlib", file=sys.stderr)
            subprocess.run([python, "-m", "pip", "install", "-q", "matplotlib"], check=True,
                           timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        warn(f"cannot install matplotlib into {venv} ({e}); no chart")
        sys.exit(NO_MATPLOTLIB)
    env = dict(os.environ, BENCH_CHART_REEXEC="1")
    os.execve(python, [python, os.path.abspath(__file__)] + sys.argv[1:], env)


def warn(msg):
    print(f"bench-chart: warning: {msg}", file=sys.stderr)


def read_results(path):
    """{(generator, members): {workload: {server: [row dicts]}}} and the rounds seen."""
    runs = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    rounds = set()
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if not line.strip() or cols[0] == "generator" or line.startswith("#"):
                continue
            r = dict(zip(COLUMNS, cols))
            for k in ("rps", "p50_ms", "p99_ms", "p999_ms", "cpu_us_op"):
                r[k] = float(r[k])
            rounds.add(int(r["round"]))
            runs[(r["generator"], int(r["members"]))][r["workload"]][r["server"]].append(r)
    return runs, len(rounds)


def server_order(servers):
    """etcd versions (ascending), then Keel, then anything else."""
    def key(s):
        if s.startswith("etcd"):
            ver = [int(x) for x in re.findall(r"\d+", s)]
            return (0, ver, s)
        return (1 if s == "keel" else 2, [], s)
    return sorted(servers, key=key)


def colors_for(servers):
    out, e = {}, 0
    for s in servers:
        if s == "keel":
            out[s] = KEEL_COLOR
        else:
            out[s] = ETCD_COLORS[e % len(ETCD_COLORS)]
            e += 1
    return out


def label(server):
    return "Keel" if server == "keel" else server


def run_date(results_path):
    meta = os.path.join(os.path.dirname(os.path.abspath(results_path)), "meta.txt")
    if os.path.exists(meta):
        for line in open(meta):
            m = re.match(r"#\s*date:\s*(\S+)", line)
            if m:
                return m.group(1).replace("T", " ").rstrip("Z") + " UTC"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(results_path)))


def bar_chart(results_path, out_png):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    runs, rounds = read_results(results_path)
    if not runs:
        raise SystemExit(f"bench-chart: no rows in {results_path}")
    keys = sorted(runs, key=lambda k: (k[1], k[0]))
    all_servers = server_order({s for k in keys for w in runs[k].values() for s in w})
    color = colors_for(all_servers)
    metrics = [("rps", "req/s (higher is better)", False),
               ("p50_ms", "p50 latency, ms (lower is better)", True),
               ("p99_ms", "p99 latency, ms (lower is better)", True),
               ("p999_ms", "p99.9 latency, ms (lower is better)", True)]
    fig, axes = plt.subplots(len(keys), len(metrics), figsize=(5.2 * len(metrics), 4.2 * len(keys)),
                             squeeze=False)
    for i, (gen, members) in enumerate(keys):
        workloads = sorted(runs[(gen, members)], key=lambda w: (ORDER.index(w) if w in ORDER else 99, w))
        servers = [s for s in all_servers if any(s in runs[(gen, members)][w] for w in workloads)]
        width = 0.8 / max(len(servers), 1)
        for j, (metric, title, log) in enumerate(metrics):
            ax = axes[i][j]
            for si, server in enumerate(servers):
                xs, meds, lo, hi = [], [], [], []
                for wi, w in enumerate(workloads):
                    vals = [r[metric] for r in runs[(gen, members)][w].get(server, [])
                            if not math.isnan(r[metric])]
                    if not vals:
                        continue
                    m = statistics.median(vals)
                    xs.append(wi - 0.4 + width * (si + 0.5))
                    meds.append(m)
                    lo.append(m - min(vals))
                    hi.append(max(vals) - m)
                if xs:
                    ax.bar(xs, meds, width, yerr=[lo, hi], capsize=2, color=color[server],
                           label=label(server), edgecolor="black", linewidth=0.4)
                    if metric == "rps":
                        for x, m in zip(xs, meds):
                            ax.annotate(f"{m:,.0f}", (x, m), ha="center", va="bottom",
                                        fontsize=6, rotation=90, xytext=(0, 2),
                                        textcoords="offset points")
            ax.set_xticks(range(len(workloads)))
            ax.set_xticklabels(workloads, rotation=20, ha="right", fontsize=8)
            ax.set_title(f"{title}\n{members} member(s), {gen}'s generator", fontsize=9)
            ax.set_xlabel("workload", fontsize=8)
            ax.set_ylabel(title.split(" (")[0].split(",")[0] + (" (ms, log)" if log else ""),
                          fontsize=8)
            if log:
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(minor_log_label))
            else:
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.grid(axis="y", alpha=0.3, which="both")
            ax.tick_params(labelsize=8)
            if j == 0:
                ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"Keel vs etcd, scripts/bench-vs-etcd.sh — {run_date(results_path)}, "
                 f"{rounds} round(s); bar = median, whisker = min–max over rounds",
                 fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def minor_log_label(v, _pos):
    """Labels the 2×, 3× and 5× minor ticks of a log axis (1, 2, 3, 5, 10, 20, ...)."""
    if v <= 0:
        return ""
    mantissa = round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6)
    return f"{v:g}" if mantissa in (2, 3, 5) else ""


def read_hgrm(path):
    """[(value_us, percentile 0..1)] rows of a percentile distribution file."""
    rows = []
    for line in open(path):
        cols = line.split()
        if len(cols) < 3 or cols[0] == "Value" or line.startswith("#"):
            continue
        rows.append((float(cols[0]), float(cols[1])))
    return rows


HGRM = re.compile(r"^keel\.(\d+)-member\.([\w-]+)\.([\w.-]+)\.round(\d+)\.txt\.hgrm$")


def curves_chart(results_path, out_png):
    """Latency by percentile from the keel-bench .hgrm files beside results.tsv."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter

    d = os.path.dirname(os.path.abspath(results_path))
    latest = {}
    for name in os.listdir(d):
        m = HGRM.match(name)
        if m:
            members, workload, server, rnd = int(m.group(1)), m.group(2), m.group(3), int(m.group(4))
            k = (members, workload, server)
            if k not in latest or rnd > latest[k][0]:
                latest[k] = (rnd, os.path.join(d, name))
    if not latest:
        warn(f"no keel-bench .hgrm files in {d}; no latency curves")
        return False
    panels = sorted({k[:2] for k in latest},
                    key=lambda p: (p[0], ORDER.index(p[1]) if p[1] in ORDER else 99, p[1]))
    servers = server_order({k[2] for k in latest})
    color = colors_for(servers)
    cols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(max(5.5 * cols, 9), 4.2 * nrows + 0.6), squeeze=False)
    ticks = [0.5, 0.9, 0.99, 0.999, 0.9999]
    for idx, (members, workload) in enumerate(panels):
        ax = axes[idx // cols][idx % cols]
        for server in servers:
            if (members, workload, server) not in latest:
                continue
            rows = [(v, p) for v, p in read_hgrm(latest[(members, workload, server)][1]) if p < 1.0]
            if rows:
                ax.plot([1 / (1 - p) for _, p in rows], [v / 1000 for v, _ in rows],
                        color=color[server], label=label(server), linewidth=1.4)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([1 / (1 - t) for t in ticks]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{100 * (1 - 1 / x):g}%"))
        ax.xaxis.set_minor_locator(FixedLocator([]))
        ax.set_xlabel("percentile", fontsize=8)
        ax.set_ylabel("latency, ms", fontsize=8)
        ax.set_title(f"{workload}, {members} member(s), keel-bench", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8)
    for idx in range(len(panels), nrows * cols):
        axes[idx // cols][idx % cols].axis("off")
    _, rounds = read_results(results_path)
    fig.suptitle(f"Latency by percentile, keel-bench --hdr-out (last round)\n"
                 f"{run_date(results_path)}, {rounds} round(s)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def check_png(path, min_bytes=20_000):
    with open(path, "rb") as f:
        head = f.read(8)
    size = os.path.getsize(path)
    if head != PNG_MAGIC:
        raise SystemExit(f"self-test: {path} is not a PNG (starts with {head!r})")
    if size < min_bytes:
        raise SystemExit(f"self-test: {path} is only {size} bytes")
    return size


def synthetic_hgrm(p50_us, path):
    """A percentile distribution of a log-normal-ish latency (keel-bench's format)."""
    lines = [f"{'Value':>12} {'Percentile':>14} {'TotalCount':>10} {'1/(1-Percentile)':>14}", ""]
    total, n = 0, 10000
    levels = [0.0]
    for k in range(14):
        base = 1 - 0.5 ** k
        levels += [base + j * 0.5 ** (k + 1) / 5 for j in range(1, 6)]
    for p in levels:
        total = max(total, int(math.ceil(p * n)))
        v = p50_us * math.exp(1.2 * math.sqrt(max(-2 * math.log(max(1 - p, 1e-9)), 0)) - 1.4)
        lines.append(f"{v:12.3f} {p:2.12f} {total:10} {1 / (1 - p):14.2f}")
    lines.append(f"{v * 2:12.3f} {1.0:2.12f} {n:10}")
    lines.append(f"#[Mean    = {p50_us:12.3f}, StdDeviation   = {p50_us / 2:12.3f}]")
    lines.append(f"#[Max     = {v * 2:12.3f}, Total count    = {n:12}]")
    lines.append(f"#[Buckets = {22:12}, SubBuckets     = {2048:12}]")
    open(path, "w").write("\n".join(lines) + "\n")


def self_test(keep):
    d = tempfile.mkdtemp(prefix="bench-chart-")
    results = os.path.join(d, "results.tsv")
    with open(results, "w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        base = {"put-c1": (900, 1.1), "put-c64": (9000, 7.0), "range-l-c64": (20000, 3.0)}
        speed = {"etcd-3.4.23": 1.0, "etcd-3.5.1": 1.3, "keel": 1.8}
        for gen in ("etcd", "keel"):
            for members in (1, 3):
                for rnd in (1, 2):
                    for server, s in speed.items():
                        for w, (rps, p50) in base.items():
                            jitter = 1 + 0.05 * rnd
                            f.write("\t".join(map(str, [
                                gen, members, w, server, rnd, rps * s * jitter / members,
                                p50 / s, 4 * p50 / s, 9 * p50 / s, 30 / s, 0])) + "\n")
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("# date: 2026-12-02T03:00:00Z\n")
    for server, s in (("etcd-3.4.23", 1.0), ("etcd-3.5.1", 1.3), ("keel", 1.8)):
        synthetic_hgrm(2000 / s, os.path.join(d, f"keel.3-member.put-c64.{server}.round2.txt.hgrm"))
    chart, curves = os.path.join(d, "chart.png"), os.path.join(d, "latency-curves.png")
    bar_chart(results, chart)
    if not curves_chart(results, curves):
        raise SystemExit("self-test: no latency curves drawn")
    sizes = check_png(chart), check_png(curves)
    print(f"bench-chart self-test ok: chart.png {sizes[0]:,} B, latency-curves.png "
          f"{sizes[1]:,} B" + (f" in {d}" if keep else ""))
    if not keep:
        shutil.rmtree(d)


def main(argv):
    if "-h" in argv or "--help" in argv or not argv:
        print(__doc__)
        return 0 if argv else 2
    ensure_matplotlib()
    if argv[:1] == ["--self-test"] and argv[1:] in ([], ["--keep"]):
        self_test(keep=argv[1:] == ["--keep"])
        return 0
    results, out, curves = argv[0], None, None
    rest = argv[1:]
    while rest:
        opt = rest.pop(0)
        if opt == "--out" and rest:
            out = rest.pop(0)
        elif opt == "--curves" and rest:
            curves = rest.pop(0)
        else:
            print(f"bench-chart: unknown argument {opt!r} (see --help)", file=sys.stderr)
            return 2
    out = out or os.path.join(os.path.dirname(os.path.abspath(results)), "chart.png")
    bar_chart(results, out)
    print(f"bench-chart: wrote {out}", file=sys.stderr)
    if curves and curves_chart(results, curves):
        print(f"bench-chart: wrote {curves}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
