"""The talk: ``python -m slides.generate`` output, and the built deck opened slide by slide in headless Chromium."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from slides.generate import (
    DECK,
    HOW_TO_MEASURE,
    PLOT_DENSITY,
    SNIPPETS,
    TEMPLATE,
    plot_size,
    render_slides,
    write_slides,
)
from slides.generate import main as generate_main

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
CHROMIUM = Path("/usr/bin/chromium")
# The screenshots the browser test keeps (slides/export/ is ignored by git).
SCREENSHOTS = Path(os.environ.get("GPULOAD_SLIDE_SCREENSHOTS", SLIDES / "export" / "test-screenshots"))


def _results(name: str) -> dict:
    return json.loads((ROOT / "assets" / "results" / f"{name}.json").read_text())


def test_rendering_is_deterministic_and_fills_every_placeholder():
    first, second = render_slides(ROOT), render_slides(ROOT)
    assert first == second
    assert "${" not in first
    assert first.startswith("---\ntheme: default\n")


def test_committed_deck_matches_the_committed_results():
    assert not write_slides(ROOT, check=True), "slides/slides.md is stale: run `python -m slides.generate`"


def test_numbers_come_from_the_results():
    deck = render_slides(ROOT)
    bench = _results("bench_cpu")["results"]
    assert f"**{bench['gpuload']['images_per_second']:,.0f}** against" in deck
    quality = next(row for row in _results("jpeg_quality")["rows"] if row["quality"] == 3)
    assert f"{quality['psnr_db']:.1f} dB" in deck
    build = _results("build_memmap")["results"][0]
    assert f"{build['images_per_second']['gpuload']['median']:,.0f}" in deck


def test_the_template_types_no_number_of_its_own():
    """Numbers on the slides come from the results: the template's prose holds none (code aside)."""
    prose = (ROOT / TEMPLATE).read_text().split("---", 2)[2]  # after the headmatter
    for code_or_markup in (r"\$\{\w+\}", r"`[^`\n]*`", r"<[^>]+>"):
        prose = re.sub(code_or_markup, "", prose)
    assert re.findall(r"(?<![\w.])\d[\d.,]*", prose) == []


def test_a_changed_result_changes_the_deck(bare_repo):
    shutil.copytree(ROOT / "assets" / "results", bare_repo / "assets" / "results", dirs_exist_ok=True)
    path = bare_repo / "assets" / "results" / "bench_cpu.json"
    report = json.loads(path.read_text())
    report["results"]["gpuload"]["images_per_second"] = 12345.0
    path.write_text(json.dumps(report))
    stock = report["results"]["collate"]["images_per_second"]
    deck = render_slides(bare_repo)
    assert "**12,345** against" in deck
    assert f"# {12345.0 / stock:.1f}x" in deck  # the big number


def test_missing_results_and_plots_are_said_plainly(bare_repo):
    deck = render_slides(bare_repo)
    for name in HOW_TO_MEASURE:
        assert f"there is no `assets/results/{name}.json`" in deck, name
    assert "<img" not in deck
    assert "**No plot yet:** `assets/transfer_order.png`" in deck
    assert not re.search(r"\d+ images/s", deck)  # no rate without a result


def test_a_cpu_only_run_says_it_is_a_stand_in():
    deck = render_slides(ROOT)
    if any(_results(name)["machine"]["gpu"] for name in ("memmap_vs_folder", "bench_cpu")):
        pytest.skip("the committed results come from a GPU machine")
    assert "No GPU has run these experiments yet" in deck
    assert "**No GPU run yet.**" in deck  # the gpuload bench on a GPU slide
    assert deck.count("**CPU stand-in:**") >= 4
    assert "run `python -m experiments.run --device cuda`" in deck
    assert "x.cuda()" not in deck and "cuda_first" not in deck.split("# The ranges")[0]


def _slides(deck: str) -> list[str]:
    """The deck cut into slides (a frontmatter block belongs to the slide it opens)."""
    body = deck.split("\n---\n", 1)[1]  # after the headmatter
    slides, current, in_code = [], [], False
    lines = body.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            in_code = not in_code
        if line == "---" and not in_code:
            slides.append("\n".join(current))
            current = []
            closing = next((j for j in range(index + 1, len(lines)) if lines[j] == "---"), None)
            between = lines[index + 1 : closing] if closing else []
            if between and all(re.match(r"^[a-zA-Z]+: ", entry) for entry in between):
                index = closing
        else:
            current.append(line)
        index += 1
    return [*slides, "\n".join(current)]


def test_every_plot_slide_has_one_takeaway_line():
    for deck in (render_slides(ROOT), (ROOT / DECK).read_text()):
        for slide in _slides(deck):
            if '<img class="plot"' in slide:
                assert slide.count('<div class="takeaway">') == 1, slide[:200]


def test_never_four_code_slides_in_a_row():
    run = 0
    for slide in _slides(render_slides(ROOT)):
        run = run + 1 if "```python" in slide else 0
        assert run < 4, slide[:200]


# The back row: code of at least 14 px on Slidev's 980-px canvas, at most 8 lines an excerpt, no line
# wider than the slide; plots drawn at the size they are shown, with text of at least 14 px.
CANVAS_WIDTH = 980
CONTENT_WIDTH = 900  # the canvas less the slide's padding (slides/style.css)
MIN_PX = 14
CODE_COLUMNS = 102  # 14 px monospace is about 8.4 px a character: 105 of them fit in 900 px less the padding


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_code_excerpts_are_short_and_narrow(name):
    lines = SNIPPETS[name].lines(ROOT)
    assert len(lines) <= 8, f"{name}: {len(lines)} lines"
    assert max(map(len, lines)) <= CODE_COLUMNS, f"{name}: {max(lines, key=len)!r}"


def test_code_is_14_px_in_the_style():
    style = (SLIDES / "style.css").read_text()
    assert re.search(r"--slidev-code-font-size:\s*(\d+)px", style).group(1) == str(MIN_PX)
    assert "lineNumbers: false" in (ROOT / TEMPLATE).read_text()  # line numbers would take the width


def test_plots_are_shown_at_the_size_they_were_drawn():
    deck = (ROOT / DECK).read_text()
    images = re.findall(r'<img class="plot" src="/([^"]+)" width="(\d+)" height="(\d+)"', deck)
    assert len(images) >= 7
    for name, width, height in images:
        png = ROOT / "assets" / name
        assert plot_size(png) == (int(width), int(height)), name
        assert int(width) <= CONTENT_WIDTH, name
        with open(png, "rb") as file:
            natural = struct.unpack(">II", file.read(24)[16:24])
        assert natural == (int(width) * PLOT_DENSITY, int(height) * PLOT_DENSITY), name


def test_figures_are_drawn_for_the_back_row(tmp_path, monkeypatch):
    from experiments import _common

    assert _common.PIXEL_DENSITY == PLOT_DENSITY
    assert _common.MIN_FONT_PX >= MIN_PX and _common.CANVAS[0] == CANVAS_WIDTH
    fig, axes = _common.figure(1, 2, size=(900, 360))
    assert tuple(fig.get_size_inches() * fig.dpi) == (900, 360)
    assert fig.dpi == 72  # 1 pt is 1 px of the canvas
    import matplotlib.pyplot as plt

    for key in _common.FONT_SIZES:
        assert plt.rcParams[key] >= MIN_PX, key
    monkeypatch.setattr(_common, "ASSETS", tmp_path)
    axes[0][0].set_title("too small to read", fontsize=10)
    with pytest.raises(ValueError, match="too small to read.* at 10.0 px"):
        _common.save_figure(fig, "small", _results("transfer_order"))
    assert not (tmp_path / "small.png").exists()
    fig, axes = _common.figure()
    fig.suptitle("a title far too long for the figure " * 4)
    with pytest.raises(ValueError, match="wider than the figure"):
        _common.save_figure(fig, "wide", _results("transfer_order"))
    with pytest.raises(ValueError, match="must fit the 980x552 slide canvas"):
        _common.figure(size=(1280, 720))


def _synthetic(name: str) -> dict:
    """Results of the experiments whose JSON is not committed yet, to draw their plots."""
    machine = _results("transfer_order")["machine"]
    spread = {"median": 900.0, "min": 800.0, "max": 1000.0, "runs": [900.0]}
    if name == "jpeg_store":
        rows = [
            {"contender": contender, "cache": cache, "images_per_second": spread, "megabytes_per_second": spread}
            for contender in ("stock", "spdl", "jpeg_crop", "jpeg_crop_exact", "jpeg_full", "raw_crop", "raw")
            for cache in ("warm", "cold")
        ]
        return {"experiment": name, "machine": machine, "device": "cpu", "device_name": "cpu (AMD EPYC, 2 cores)",
                "images": 2000, "batch_size": 64, "workers": 2, "rows": rows,
                "bytes_on_disk": {"source": 94e6, "raw": 1843.2e6, "jpeg": 94e6}}  # fmt: skip
    rows = [
        {"decoder": decoder, "threads": threads, "images_per_second": spread}
        for decoder in ("pillow", "torchvision", "simplejpeg", "simplejpeg_fast", "simplejpeg_half_scale", "opencv")
        for threads in (1, 2)
    ]
    return {"experiment": name, "machine": machine, "images": 600, "image_size": [480, 640],
            "cpu": "AMD EPYC, 2 cores", "rows": rows}  # fmt: skip


PLOTTED = {
    "transfer_order": ["transfer_order"],
    "train_order": ["train_order", "train_order_trace"],
    "jpeg_quality": ["jpeg_quality", "jpeg_quality_crops"],
    "memmap_vs_folder": ["memmap_vs_folder"],
    "gpu_preprocess": ["gpu_preprocess"],
    "train_augment": ["train_augment"],
    "jpeg_store": ["jpeg_store"],
    "decoders": ["decoders"],
}


@pytest.mark.parametrize("experiment", sorted(PLOTTED))
def test_every_plot_meets_the_bar(experiment, tmp_path, monkeypatch):
    """Each experiment's plot from its committed (or a synthetic) result: save_figure refuses text under
    14 px or a title wider than the figure, and the PNG is its canvas size at the pixel density."""
    import importlib

    from experiments import _common

    module = importlib.import_module(f"experiments.{experiment}")
    path = ROOT / "assets" / "results" / f"{experiment}.json"
    result = json.loads(path.read_text()) if path.is_file() else _synthetic(experiment)
    monkeypatch.setattr(_common, "ASSETS", tmp_path)
    module.plot(result)
    for name in PLOTTED[experiment]:
        width, height = plot_size(tmp_path / f"{name}.png")
        assert width <= CONTENT_WIDTH and height <= 400, name


def test_the_code_on_the_slides_is_the_source():
    deck = render_slides(ROOT)
    for snippet in SNIPPETS.values():
        assert "\n".join(snippet.lines(ROOT)) in deck
    source = (ROOT / "gpuload" / "transforms" / "normalize.py").read_text()
    assert "return torch.addcmul(self.shift, images, self.scale)" in source
    assert "```python {all|6|all}\ndef forward(self, images: torch.Tensor) -> torch.Tensor:" in deck


def test_placeholders_must_match(bare_repo):
    template = bare_repo / TEMPLATE
    text = template.read_text()
    template.write_text(text + "\n${no_such_value}\n")
    with pytest.raises(ValueError, match="no_such_value"):
        render_slides(bare_repo)
    template.write_text(text.replace("${closing_numbers}", ""))
    with pytest.raises(ValueError, match="does not use: \\['closing_numbers'\\]"):
        render_slides(bare_repo)


def test_outside_the_repository_it_says_where_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run this in the gpuload repository"):
        render_slides(tmp_path)


def test_invalid_result_json_names_the_file(bare_repo):
    (bare_repo / "assets" / "results" / "train_order.json").write_text("{not json")
    with pytest.raises(ValueError, match="train_order.json is not valid JSON"):
        render_slides(bare_repo)


def test_a_result_without_the_expected_fields_is_named(bare_repo):
    machine = _results("memmap_vs_folder")["machine"]
    (bare_repo / "assets" / "results" / "memmap_vs_folder.json").write_text(json.dumps({"machine": machine}))
    with pytest.raises(ValueError, match="the memmap slides read .*rerun its experiment"):
        render_slides(bare_repo)


def test_write_slides_writes_once(bare_repo):
    assert write_slides(bare_repo, check=True)
    assert not (bare_repo / DECK).exists()  # check only compares
    assert write_slides(bare_repo)
    assert not write_slides(bare_repo)
    assert {path.name for path in (bare_repo / "slides").iterdir()} == {"template.md", "slides.md"}  # no temporary left


# --- the built deck in a real browser -----------------------------------------------------------


def _browser_prerequisites() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium (apt-get install chromium)"
    if not (SLIDES / "node_modules" / ".bin" / "slidev").exists():
        return "no slides/node_modules (cd slides && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no playwright (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def built_deck(tmp_path_factory) -> Path:
    reason = _browser_prerequisites()
    if reason:
        if os.environ.get("GPULOAD_REQUIRE_SLIDES"):
            pytest.fail(f"GPULOAD_REQUIRE_SLIDES is set but {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("deck") / "dist"
    subprocess.run(
        [str(SLIDES / "node_modules" / ".bin" / "slidev"), "build", "slides.md", "--out", str(out), "--base", "./"],
        cwd=SLIDES,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def served_deck(built_deck: Path):
    handler = functools.partial(_QuietHandler, directory=str(built_deck))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _slide_count(deck: str) -> int:
    """Slides in the Markdown: a ``---`` line starts a slide unless it closes a frontmatter block."""
    lines = deck.splitlines()
    count, index, in_code = 1, 1, False
    while lines[index] != "---":  # the headmatter belongs to slide 1
        index += 1
    index += 1
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            in_code = not in_code
        elif line == "---" and not in_code:
            count += 1
            closing = next((j for j in range(index + 1, len(lines)) if lines[j] == "---"), None)
            between = lines[index + 1 : closing] if closing else []
            if between and all(re.match(r"^[a-zA-Z]+: ", entry) for entry in between):
                index = closing  # a frontmatter block: its closing --- starts no slide
        index += 1
    return count


def _inked(screenshot: Path) -> float:
    """The fraction of a screenshot's pixels that are not the background."""
    from PIL import Image

    gray = Image.open(screenshot).convert("L")
    background = max(gray.getcolors(1 << 16))[1]  # the most frequent shade
    return sum(count for count, shade in gray.getcolors(1 << 16) if abs(shade - background) > 24) / (
        gray.width * gray.height
    )


def test_slide_count_reads_frontmatter_blocks():
    deck = "---\ntheme: x\n---\n\n# one\n\n---\nlayout: section\n---\n\n# two\n\n```\n---\n```\n---\n\n# three\n"
    assert _slide_count(deck) == 3
    assert [slide.strip() for slide in _slides(deck)] == ["# one", "# two\n\n```\n---\n```", "# three"]
    assert len(_slides(render_slides(ROOT))) == _slide_count(render_slides(ROOT))


@pytest.mark.slides
def test_every_slide_renders_in_chromium(served_deck):
    from playwright.sync_api import sync_playwright

    slides = _slide_count((ROOT / DECK).read_text())
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"]  # fmt: skip
    problems: list[str] = []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=flags)
        page = browser.new_page(viewport={"width": 1280, "height": 720})

        def on_console(message) -> None:
            if message.type == "error":
                problems.append(f"console error: {message.text}")

        def on_request(request) -> None:
            if not request.url.startswith((served_deck, "data:")):
                problems.append(f"leaves the machine: {request.url}")

        def on_response(response) -> None:
            if response.status >= 400:
                problems.append(f"{response.status} {response.url}")

        page.on("console", on_console)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("request", on_request)
        page.on("requestfailed", lambda request: problems.append(f"failed: {request.url} {request.failure}"))
        page.on("response", on_response)
        for number in range(1, slides + 1):
            # ?clicks past the last step: every v-click shown, as a PDF page or the end of the slide shows it
            page.goto(f"{served_deck}#/{number}?clicks=99", wait_until="networkidle")
            selector = f".slidev-page-{number}"
            page.wait_for_selector(selector, state="attached", timeout=15_000)
            page.wait_for_timeout(600)  # the slide transition
            content = page.evaluate(
                """(selector) => {
                    const slide = document.querySelector(selector);
                    const title = slide.querySelector('h1');
                    const layout = slide.querySelector('.slidev-layout').getBoundingClientRect();
                    const parts = [...slide.querySelectorAll('.slidev-layout h1, p, li, pre, img, table')];
                    // the slide canvas is scaled to the window: canvas px = screen px / scale
                    const canvas = slide.querySelector('.slidev-layout');
                    const scale = layout.width / canvas.offsetWidth;
                    return {
                        body: slide.innerText.replace(title ? title.innerText : '', '').trim(),
                        images: [...slide.querySelectorAll('img')].map(i => ({src: i.src, complete: i.complete, width: i.naturalWidth})),
                        below: parts.filter(e => e.getBoundingClientRect().bottom > layout.bottom + 1).map(e => e.tagName),
                        wide: [...slide.querySelectorAll('pre')].filter(e => e.scrollWidth > e.clientWidth + 1).length,
                        canvasWidth: canvas.offsetWidth,
                        // computed font sizes are canvas px (the scale is a transform): on screen, px * scale
                        code: [...slide.querySelectorAll('pre, .slidev-code, pre code span')].map(
                            e => parseFloat(getComputedStyle(e).fontSize)),
                        scale: scale,
                        plots: [...slide.querySelectorAll('img.plot')].map(i => ({
                            src: i.src, natural: i.naturalWidth, shown: i.getBoundingClientRect().width / scale,
                            right: i.getBoundingClientRect().right - layout.right,
                        })),
                    };
                }""",
                selector,
            )
            if content["below"]:
                problems.append(f"slide {number}: runs off the bottom: {content['below']}")
            if content["wide"]:
                problems.append(f"slide {number}: {content['wide']} code block(s) wider than the slide")
            for image in content["images"]:
                if not image["complete"] or image["width"] == 0:
                    problems.append(f"slide {number}: image not loaded: {image['src']}")
            if content["canvasWidth"] != CANVAS_WIDTH:
                problems.append(f"slide {number}: the canvas is {content['canvasWidth']} px wide, not {CANVAS_WIDTH}")
            if content["code"] and min(content["code"]) < MIN_PX:
                problems.append(
                    f"slide {number}: code at {min(content['code']):.1f} px on the canvas "
                    f"({min(content['code']) * content['scale']:.1f} px on the screen), under {MIN_PX}"
                )
            for plot in content["plots"]:
                # drawn at natural / PLOT_DENSITY canvas px with text of at least MIN_PX: shown smaller, it shrinks
                if plot["shown"] < plot["natural"] / PLOT_DENSITY - 1:
                    problems.append(
                        f"slide {number}: {plot['src']} shown {plot['shown']:.0f} px wide, drawn for "
                        f"{plot['natural'] / PLOT_DENSITY:.0f}: its text is under {MIN_PX} px"
                    )
                if plot["right"] > 1:
                    problems.append(f"slide {number}: {plot['src']} runs off the right edge")
            screenshot = SCREENSHOTS / f"slide-{number:02d}.png"
            page.screenshot(path=str(screenshot))
            if not (content["body"] or content["images"]) or _inked(screenshot) < 0.01:
                problems.append(f"slide {number} is blank: {content['body']!r}, {_inked(screenshot):.1%} inked")
        page.goto(f"{served_deck}#/{slides + 1}", wait_until="networkidle")  # one past the last: no such slide
        page.wait_for_timeout(600)
        beyond = page.query_selector(f".slidev-page-{slides + 1}")
        browser.close()
    assert beyond is None, f"the browser shows more slides than the Markdown's {slides}"
    assert not problems, "\n".join(problems)


def test_results_from_a_gpu_fill_the_gpu_slides(bare_repo):
    """A GPU run's results (<name>_cuda.json, bench_cuda.json: the committed CPU results dressed up as one)
    are preferred to the CPU results, and no slide calls itself a CPU stand-in any more."""
    results = bare_repo / "assets" / "results"
    shutil.copytree(ROOT / "assets" / "results", results, dirs_exist_ok=True)
    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0"}
    name = "cuda (NVIDIA H100 80GB HBM3)"
    for experiment in ("transfer_order", "train_order", "jpeg_quality", "memmap_vs_folder", "gpu_preprocess",
                       "train_augment"):  # fmt: skip
        result = _results(experiment)
        result["machine"].update(gpu)
        result.update(device="cuda", device_name=name)
        for row in result["rows"]:
            if "device" in row:
                row["device"] = "cuda"
        if experiment == "memmap_vs_folder":
            result["device_names"] = {"cuda": name}
        if experiment == "transfer_order":
            result["rows"] += [dict(row, memory="pinned", seconds=dict(row["seconds"], median=row["seconds"]["median"] / 2))
                               for row in result["rows"]]  # fmt: skip
        (results / f"{experiment}_cuda.json").write_text(json.dumps(result))
    store = _synthetic("jpeg_store")
    store["machine"] = dict(store["machine"], **gpu)
    store.update(device="cuda", device_name=name)
    (results / "jpeg_store_cuda.json").write_text(json.dumps(store))
    bench = _results("bench_cpu")
    bench["machine"].update(gpu)
    bench["device"] = "cuda"
    bench["results"]["limit_h2d"] = dict(bench["results"]["gpuload"], images_per_second=20000.0)
    (results / "bench_cuda.json").write_text(json.dumps(bench))

    deck = render_slides(bare_repo)
    assert "Not measured yet" not in deck
    assert "CPU stand-in" not in deck and "No GPU" not in deck
    assert "NVIDIA H100 80GB HBM3 (CUDA 13.0)" in deck
    share = f"{100 * bench['results']['gpuload']['images_per_second'] / 20000:.0f} %"
    assert f"reaches **{share}** of the pinned host-to-device limit" in deck
    assert "To cuda (NVIDIA H100 80GB HBM3), " in deck
    assert "# Memmap against folder, to CUDA" in deck
    assert ", pinned: " in deck  # the transfer example prefers pinned memory on a GPU
    assert "pinned **" in deck and "(2.0x)" in deck  # pinned against pageable, from transfer_order_cuda
    for stem in ("transfer_order_cuda", "train_order_cuda", "memmap_vs_folder_cuda", "gpu_preprocess_cuda"):
        assert f"<code>assets/results/{stem}.json</code>" in deck
        assert f"`assets/{stem}.png`" in deck  # the GPU plot is the one asked for (none in the bare repo)
    assert "`assets/train_order_trace_cuda.png`" in deck
    assert "<code>assets/results/transfer_order.json</code>" not in deck


def test_generate_check_and_write(capsys, bare_repo):
    root = Path(__file__).resolve().parent.parent
    assert generate_main(["--repo", str(root), "--check"]) == 0
    assert "is up to date" in capsys.readouterr().out
    (bare_repo / "slides" / "slides.md").write_text("old talk")
    assert generate_main(["--repo", str(bare_repo), "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert generate_main(["--repo", str(bare_repo)]) == 0
    assert capsys.readouterr().out.startswith("wrote ")
    assert "there is no `assets/results/bench_cpu.json`" in (bare_repo / "slides" / "slides.md").read_text()


def test_generate_outside_the_repository(capsys, tmp_path):
    assert generate_main(["--repo", str(tmp_path)]) == 2
    assert "run this in the gpuload repository" in capsys.readouterr().err
