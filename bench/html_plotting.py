"""Why the HTML report draws its own SVG: the same two charts (a 2,000-sample stacked KV timeline and 1,000
request lanes) drawn by kv-guardian's renderer and by matplotlib (SVG backend), plotly (offline HTML) and
Vega-Lite (altair + vl-convert), in the same run. Writes bench/results/html_plotting.json.

For each: seconds to import (a fresh interpreter, median of ``--rounds``), seconds to draw both charts (median),
bytes of output, how many shapes carry their own hover text (an SVG ``<title>``: what the report's no-JS hover
and its browser tests rely on), whether the output shows the charts without JavaScript (SVG in the file), and
the installed size of the package with what it pulls in beyond kv-guardian's own dependencies.

The plotting packages are not kv-guardian dependencies: they are measured in a separate virtualenv given by
``--plot-python`` (made once, e.g. ``python3.11 -m venv /tmp/plot && /tmp/plot/bin/pip install matplotlib
plotly vl-convert-python altair``); without it only kv-guardian's row is measured.

    nice .venv/bin/python bench/html_plotting.py --plot-python /tmp/plot/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the report builder the tests use

from kvg_reports import synthetic_report

SAMPLES, LANES = 2000, 1000

# Runs in the plotting virtualenv: argv = [which, data.json, out folder]; prints one JSON object.
THEIRS = r'''
import json, statistics, sys, time
from pathlib import Path
which, data, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
ts, live, ret, orph = ([s[i] for s in data["samples"]] for i in range(4))
lanes = data["lanes"]
t0 = time.perf_counter()

def mpl():
    import matplotlib
    matplotlib.use("svg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt
    imp = time.perf_counter() - t0
    def draw():
        fig, ax = plt.subplots(figsize=(12, 3))
        ax.stackplot(ts, orph, ret, live, step="post", labels=["orphaned", "retained", "live"])
        ax.legend()
        fig.savefig(out / "mpl-timeline.svg", format="svg")
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(12, 0.12 * len(lanes) + 1))
        ax.barh(range(len(lanes)), [l["end"] - l["start"] for l in lanes], left=[l["start"] for l in lanes])
        tails = [(i, l) for i, l in enumerate(lanes) if l["after"]]
        ax.barh([i for i, _ in tails], [data["now"] - l["end"] for _, l in tails], left=[l["end"] for _, l in tails],
                color="crimson")
        ax.set_yticks(range(len(lanes)), [l["id"] for l in lanes], fontsize=4)
        fig.savefig(out / "mpl-lanes.svg", format="svg")
        plt.close(fig)
        return [out / "mpl-timeline.svg", out / "mpl-lanes.svg"]
    return imp, draw

def plotly():
    import plotly.graph_objects as go
    imp = time.perf_counter() - t0
    def draw():
        fig = go.Figure([go.Scatter(x=ts, y=y, name=n, stackgroup="kv", line_shape="hv")
                         for n, y in (("orphaned", orph), ("retained", ret), ("live", live))])
        lanes_fig = go.Figure(go.Bar(orientation="h", y=[l["id"] for l in lanes], base=[l["start"] for l in lanes],
                                     x=[l["end"] - l["start"] for l in lanes]))
        p = out / "plotly.html"
        p.write_text(fig.to_html(include_plotlyjs=True, full_html=True)
                     + lanes_fig.to_html(include_plotlyjs=False, full_html=False))
        return [p]
    return imp, draw

def vega():
    import altair as alt
    import vl_convert as vlc
    imp = time.perf_counter() - t0
    def draw():
        rows = [{"t": t, "state": n, "bytes": y[i]} for i, t in enumerate(ts)
                for n, y in (("orphaned", orph), ("retained", ret), ("live", live))]
        area = alt.Chart(alt.Data(values=rows)).mark_area(interpolate="step-after").encode(
            x="t:Q", y="bytes:Q", color="state:N", tooltip=["t:Q", "state:N", "bytes:Q"]).properties(width=900)
        bars = alt.Chart(alt.Data(values=lanes)).mark_bar().encode(
            x="start:Q", x2="end:Q", y=alt.Y("id:N", sort=None), tooltip=["id:N", "start:Q", "end:Q"])
        paths = []
        for name, chart in (("timeline", area), ("lanes", bars)):
            p = out / f"vega-{name}.svg"
            p.write_text(vlc.vegalite_to_svg(chart.to_dict()))
            paths.append(p)
        return paths
    return imp, draw

imp, draw = {"matplotlib": mpl, "plotly": plotly, "vega-lite": vega}[which]()
draw()  # warm (fonts, caches)
times = []
for _ in range(int(data["rounds"])):
    t = time.perf_counter()
    paths = draw()
    times.append(time.perf_counter() - t)
import re
body = "".join(p.read_text() for p in paths)
size = len(body.encode())
body = re.sub(r"<script[^>]*>.*?</script>", "", body, flags=re.S)  # what shows without JavaScript
print(json.dumps({"import_s": imp, "draw_s": statistics.median(times), "bytes": size,
                  "titles": body.count("<title"), "svg_in_file": body.count("<svg")}))
'''

# Installed size of a distribution and what it requires, less what kv-guardian's own environment already has.
SIZE = r'''
import importlib.metadata as md, json, re, sys
base = set(json.loads(sys.argv[2]))
seen, total, todo = set(), 0, [sys.argv[1]]
while todo:
    name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
    if name in seen or name in base:
        continue
    seen.add(name)
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    total += sum((f.size or 0) for f in dist.files or ())
    todo += [r for r in (dist.requires or ()) if "extra ==" not in r]
print(json.dumps({"installed_bytes": total, "distributions": sorted(seen)}))
'''


def _history(n_samples: int, n_lanes: int) -> dict:
    data = synthetic_report(n_lanes, leak_every=10, max_lanes=n_lanes, capacity=n_samples * 2)
    tl = data["summary"]["timeline"]
    while len(tl["samples"]) < n_samples:  # pad with interval samples up to the count compared
        last = tl["samples"][-1]
        tl["samples"].append([last[0] + 0.01, *last[1:]])
    tl["samples"] = tl["samples"][:n_samples]
    return data


def _ours(data: dict, rounds: int) -> dict:
    from kvguardian.core.report.history import read_history
    from kvguardian.core.report.html import lanes
    from kvguardian.core.report.html.lanes import render_lanes
    from kvguardian.core.report.html.timeline import render_timeline

    imports = []
    for _ in range(rounds):
        code = ("import time; t = time.perf_counter(); import kvguardian.core.report.html.page; "
                "print(time.perf_counter() - t)")
        imports.append(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout))
    hist = read_history(data["summary"]["timeline"])
    lanes.MAX_LANES = LANES  # like the others, every lane (a report draws at most 400)
    times, body = [], ""
    for _ in range(rounds + 1):
        t = time.perf_counter()
        body = render_timeline(hist, [], "t") + render_lanes(hist, "l")
        times.append(time.perf_counter() - t)
    assert "<script" not in body
    drawn = int(re.search(r'data-lanes="(\d+)"', body).group(1))  # type: ignore[union-attr]
    return {"import_s": statistics.median(imports), "draw_s": statistics.median(times[1:]), "lanes_drawn": drawn,
            "bytes": len(body.encode()), "titles": body.count("<title"), "svg_in_file": body.count("<svg"),
            "installed_bytes": 0, "distributions": []}


def _base_distributions() -> list[str]:
    import importlib.metadata as md

    return sorted({(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()})


def _theirs(python: str, which: str, package: str, data_path: Path, folder: Path, rounds: int) -> dict:
    imports, row = [], {}
    for _ in range(rounds):  # a fresh interpreter each time: the import cost a report command would pay
        proc = subprocess.run([python, "-c", THEIRS, which, str(data_path), str(folder)], capture_output=True,
                              text=True, timeout=1800)
        if proc.returncode:
            return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
        row = json.loads(proc.stdout)
        imports.append(row["import_s"])
    row["import_s"] = statistics.median(imports)
    size = subprocess.run([python, "-c", SIZE, package, json.dumps(_base_distributions())], capture_output=True,
                          text=True, check=True)
    return {**row, **json.loads(size.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot-python", default=os.environ.get("KVG_PLOT_PYTHON"),
                    help="a Python with matplotlib, plotly, altair and vl-convert-python installed")
    ap.add_argument("--out", default="bench/results/html_plotting.json")
    args = ap.parse_args()
    data = _history(SAMPLES, LANES)
    tl = data["summary"]["timeline"]
    rows: dict[str, dict] = {"kv-guardian": _ours(data, args.rounds)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plain = {"samples": tl["samples"], "now": tl["now"], "rounds": args.rounds,
                 "lanes": [{"id": r["id"], "start": r["start"], "end": r["end"], "after": bool(r["after_end"])}
                           for r in tl["requests"]]}
        data_path = folder / "data.json"
        data_path.write_text(json.dumps(plain))
        if args.plot_python:
            for which, package in (("matplotlib", "matplotlib"), ("plotly", "plotly"),
                                   ("vega-lite", "vl-convert-python")):
                rows[which] = _theirs(args.plot_python, which, package, data_path, folder, args.rounds)
    for row in rows.values():
        for k in ("import_s", "draw_s"):
            if k in row:
                row[k] = round(row[k], 3)
    write_json(args.out, {
        "benchmark": "html_plotting", "samples": len(tl["samples"]), "lanes": len(tl["requests"]),
        "rounds": args.rounds, "results": rows,
        "notes": {"titles": "<title> elements outside <script>: hover text without JavaScript, what tests query",
                  "svg_in_file": "<svg> elements outside <script>: 0 means nothing is drawn without JavaScript",
                  "installed_bytes": "the package and what it requires beyond the packages .venv already has",
                  "lanes_drawn": "every lane, as the others (a report itself draws at most 400: every request with KV "
                                 "after its end first)"},
        "loadavg": os.getloadavg(), "python": platform.python_version(),
    })


if __name__ == "__main__":
    main()
