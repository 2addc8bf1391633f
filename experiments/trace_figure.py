"""Draw one profiler step of a Chrome trace (``profiler.export_chrome_trace``) as Perfetto shows it.

A slide cannot embed Perfetto, so this renders the same picture from the trace file: one lane per
thread (and per CUDA stream), nested ranges stacked below their parents, ``record_function`` ranges
labelled. The top panel is a whole training step, the bottom one zooms on the data-to-model part
(from the first ``record_function`` range to the start of ``forward``), which a whole step hides.

    python -m experiments.trace_figure assets/traces/train_order_cuda_first.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

from ._common import figure, read_result, save_figure

MAX_LABEL = 32  # characters of a box's label or legend entry
LEGEND_BOXES = 4  # narrow boxes named in a panel's legend, the longest first
MAX_DEPTH = 4  # ProfilerStep > record_function range > op > sub-op; deeper levels are noise on a slide
CHARACTER_WIDTH = 0.0115  # of the axis width, for the 14 px labels on a 900 px wide figure
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
MIN_SHARE = 0.005  # of the span: narrower boxes are not drawn (unreadable); record_function ones get a marker
SHORT_MARKERS = "vDs^P*"  # one per record_function range too short to draw


def load_events(path: Path) -> list[dict]:
    """The complete (``"ph": "X"``) events of a Chrome trace, ``.json`` or ``.json.gz``."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        trace = json.load(file)
    return [event for event in trace["traceEvents"] if event.get("ph") == "X" and "dur" in event]


def last_step(events: list[dict]) -> tuple[float, float]:
    """Start and end (µs) of the last ``ProfilerStep#N`` range."""
    steps = [event for event in events if event["name"].startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace has no ProfilerStep range: was it recorded with a profiler schedule?")
    step = max(steps, key=lambda event: event["ts"])
    return step["ts"], step["ts"] + step["dur"]


def lanes(
    events: list[dict], start: float, end: float, max_depth: int = MAX_DEPTH
) -> list[tuple[str, list[tuple[int, dict]]]]:
    """``[(lane name, [(depth, event), ...]), ...]`` for the events inside ``[start, end]``: CPU
    threads first (the one running the profiler's steps named "training loop"), then CUDA streams,
    each nested by time containment, ``max_depth`` levels at most."""
    by_lane: dict[tuple[bool, int], list[dict]] = {}
    for event in events:
        if event["ts"] < start or event["ts"] + event["dur"] > end:
            continue
        by_lane.setdefault((event.get("cat") in GPU_CATEGORIES, event["tid"]), []).append(event)
    loop = next((event["tid"] for event in events if event["name"].startswith("ProfilerStep#")), None)
    others = iter(range(2, len(by_lane) + 2))
    result = []
    for (on_gpu, tid), members in sorted(by_lane.items(), key=lambda item: (item[0][0], item[0][1] != loop)):
        if on_gpu:
            name = f"CUDA stream {tid}"
        else:
            name = "training loop" if tid == loop else f"CPU thread {next(others)}"
        members.sort(key=lambda event: (event["ts"], -event["dur"]))
        stack: list[float] = []  # end times of the open parents
        nested = []
        for event in members:
            while stack and event["ts"] >= stack[-1]:
                stack.pop()
            if len(stack) < max_depth:
                nested.append((len(stack), event))
            stack.append(event["ts"] + event["dur"])
        result.append((name, nested))
    return result


def label_of(event: dict) -> str:
    """What a box says: an op without ``aten::``; a CUDA kernel by its function's name alone (a kernel's
    name is its whole C++ signature, templates and all); at most ``MAX_LABEL`` characters.

    Example:
        >>> label_of({"name": "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<(lambda)>>(int, T)",
        ...           "cat": "kernel"})
        'elementwise_kernel'
    """
    name = event["name"].removeprefix("aten::")
    if event.get("cat") == "kernel":
        signature = re.sub(r"^void\s+", "", name).replace("(anonymous namespace)::", "")
        name = re.split(r"[<(]", signature, maxsplit=1)[0].rsplit("::", 1)[-1] or signature
    return name if len(name) <= MAX_LABEL else name[: MAX_LABEL - 1] + "\u2026"


def _colour(name: str, palette: dict):
    """The colour of the boxes named ``name``: the next of tab20 for each new name, so no two names share one."""
    import matplotlib

    if name not in palette:
        palette[name] = matplotlib.colormaps["tab20"](len(palette) % 20)
    return palette[name]


def draw(
    axis,
    events: list[dict],
    start: float,
    end: float,
    title: str,
    max_depth: int = MAX_DEPTH,
    palette: dict | None = None,
    mark_short: bool = False,
) -> None:
    """Boxes of every event in ``[start, end]`` on ``axis``, time in ms from ``start``; a box too narrow
    for its name gets a legend entry instead, for the ``LEGEND_BOXES`` names that take the most time
    (boxes under ``MIN_SHARE`` of the span are not drawn: unreadable). With ``mark_short``, a ``record_function`` range under that gets a marker where it is,
    and a legend entry with its duration."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    span = end - start
    palette = {} if palette is None else palette
    row = 0
    ticks, tick_labels, unlabelled, marked = [], [], {}, {}
    for lane, nested in lanes(events, start, end, max_depth):
        depth = max(depth for depth, _ in nested) + 1
        ticks.append(row + depth / 2)
        tick_labels.append(lane)
        for level, event in nested:
            if event["dur"] < MIN_SHARE * span:
                name = label_of(event)
                if mark_short and event.get("cat") == "user_annotation" and name not in marked:
                    marker = SHORT_MARKERS[len(marked) % len(SHORT_MARKERS)]
                    colour = _colour(name, palette)
                    x, y = (event["ts"] + event["dur"] / 2 - start) / 1e3, row + level + 0.5
                    style = {"marker": marker, "color": colour, "markeredgecolor": "black", "markersize": 11}
                    axis.plot([x], [y], linestyle="none", clip_on=False, zorder=5, **style)
                    label = f"{name}: {event['dur'] / 1e3:.2g} ms"
                    marked[name] = Line2D([], [], linestyle="none", label=label, **style)
                continue
            left, width = (event["ts"] - start) / 1e3, event["dur"] / 1e3
            label = label_of(event)
            colour = _colour(label, palette)
            axis.broken_barh([(left, width)], (row + level + 0.05, 0.9), color=colour, edgecolor="white")
            if len(label) * CHARACTER_WIDTH * span < event["dur"]:  # only labels that fit in their box
                axis.text(
                    left + width / 2, row + level + 0.5, label, ha="center", va="center", fontsize=18, clip_on=True
                )
            else:
                colour_and_time = unlabelled.setdefault(label, [colour, 0.0])
                colour_and_time[1] += event["dur"]
        row += depth + 0.5
    axis.set_xlim(0, span / 1e3)
    axis.set_ylim(row, 0)
    axis.set_yticks(ticks, tick_labels)
    axis.set_xlabel("time since the start of the range (ms)")
    axis.set_title(title)
    axis.grid(True, axis="x", alpha=0.3)
    if unlabelled or marked:
        # The narrow boxes that take the most time (a GPU step has dozens of kernels: a legend of all of
        # them would cover the panel), then the markers.
        longest = sorted(unlabelled.items(), key=lambda item: -item[1][1])[:LEGEND_BOXES]
        handles = [Patch(color=colour, label=label) for label, (colour, _) in longest]
        title = "narrow boxes" if not marked else "too short to draw" if not unlabelled else "narrow / too short"
        if len(unlabelled) > LEGEND_BOXES:
            title = f"narrow boxes: the {LEGEND_BOXES} longest of {len(unlabelled)}" + (
                " / too short" if marked else ""
            )
        handles += list(marked.values())
        axis.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), title=title, frameon=False)


def plot_trace(trace: Path, name: str, result: dict, caption: str) -> Path:
    """Save ``assets/<name>.png``: the last profiler step of ``trace`` and a zoom on its input pipeline."""
    events = load_events(trace)
    start, end = last_step(events)
    inside = [event for event in events if start <= event["ts"] and event["ts"] + event["dur"] <= end]
    forward = min((event["ts"] for event in inside if event["name"] == "forward"), default=end)
    first_range = min(
        (event["ts"] for event in inside if event.get("cat") == "user_annotation" and event["ts"] > start),
        default=start,
    )
    fig, axes = figure(2, 1, size=(900, 350))
    top, bottom = axes[:, 0]
    palette: dict = {}  # one colour per name in both panels
    draw(top, events, start, end, f"one training step ({caption})", max_depth=2, palette=palette)
    zoom = _zoom_title(inside, first_range, forward)
    draw(bottom, events, first_range, forward, zoom, palette=palette, mark_short=True)
    # the legends stand right of the panels: the layout makes room for them (they are the axes' artists)
    return save_figure(fig, name, result, statistics="one profiler step, as recorded")


def _zoom_title(events: list[dict], start: float, end: float) -> str:
    """The zoom panel's title: the ``record_function`` ranges it shows, in order, and which of them are
    too short to draw (marked instead)."""
    ranges = [e for e in events if e.get("cat") == "user_annotation" and start <= e["ts"] and e["ts"] + e["dur"] <= end]
    names = list(dict.fromkeys(e["name"] for e in sorted(ranges, key=lambda e: e["ts"])))
    short = [n for n in names if all(e["dur"] < MIN_SHARE * (end - start) for e in ranges if e["name"] == n)]
    if not short:
        return f"zoom on the step's start: {' -> '.join(names)}, until forward"
    return f"zoom on the step's start, until forward ({', '.join(short)}: too short to draw, marked)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--name", default="train_order_trace", help="the PNG's name in assets/")
    parser.add_argument("--device", default="cpu", help="whose train_order result stamps the figure (default: cpu)")
    args = parser.parse_args(argv)
    print(f"wrote {plot_trace(args.trace, args.name, read_result('train_order', args.device), args.trace.name)}")


if __name__ == "__main__":
    main()
