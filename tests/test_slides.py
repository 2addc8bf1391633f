"""The talk: ``python -m slides.generate`` output, and the built deck opened slide by slide in headless Chromium."""

from __future__ import annotations

import ast
import functools
import http.server
import inspect
import json
import os
import re
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from experiments.numbers import times
from slides.generate import (
    BACKUP,
    DECK,
    GPU_CHECK,
    GPU_OWED,
    HOW_TO_MEASURE,
    MAX_SLIDES,
    PDF,
    PDF_SOURCES,
    PLOT_DENSITY,
    QR,
    SNIPPETS,
    TALK_MINUTES,
    TEMPLATE,
    plot_size,
    render_slides,
    talk_digest,
    write_slides,
)
from slides.generate import main as generate_main
from slides.quoted import GPU_TRAINING

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
CHROMIUM = Path("/usr/bin/chromium")
# The screenshots the browser test keeps (slides/export/ is ignored by git).
SCREENSHOTS = Path(os.environ.get("GPULOAD_SLIDE_SCREENSHOTS", SLIDES / "export" / "test-screenshots"))

# The back row, on Slidev's 980x552 canvas: body text of 24 px or more (at least 90 % of it; a slide's
# small source line and a diagram's labels aside), nothing under 18 px, code of 20 px; plots drawn at the
# size they are shown, with text of at least 18 px; code excerpts of at most 8 lines as shown (a line longer
# than the slide wraps), written code no wider than the slide.
CANVAS_WIDTH = 980
CONTENT_WIDTH = 900  # the canvas less the slide's padding (slides/style.css)
TEXT_PX, SMALLEST_PX, CODE_PX, PLOT_PX = 24, 18, 20, 18
LABEL_PX = 20  # a diagram's labels (the plan's boxes, the page cache's grid, the ring, the timeline)
TEXT_SHARE = 0.9  # of the deck's characters (code aside) at TEXT_PX or more
SLIDE_TEXT_SHARE = 0.75  # the same, on any one slide with some prose (SLIDE_PROSE characters)
SLIDE_PROSE = 80
CODE_COLUMNS = 72  # 20 px monospace is 12 px a character: 72 of them fit in 900 px less the block's padding
CODE_LINES = 13  # a written example; an excerpt of the source has at most 8


def _results(name: str) -> dict:
    return json.loads((ROOT / "assets" / "results" / f"{name}.json").read_text())


@pytest.fixture
def talk_repo(bare_repo: Path) -> Path:
    """The bare repository with the committed results and plots: it renders the committed talk."""
    shutil.copytree(ROOT / "assets", bare_repo / "assets", dirs_exist_ok=True)
    shutil.copy(ROOT / "README.md", bare_repo / "README.md")
    return bare_repo


def _store_rate(result: dict, contender: str, cache: str = "warm") -> float:
    row = next(row for row in result["rows"] if (row["contender"], row["cache"]) == (contender, cache))
    return row["images_per_second"]["median"]


def test_rendering_is_deterministic_and_fills_every_placeholder():
    first, second = render_slides(ROOT), render_slides(ROOT)
    assert first == second
    assert "${" not in first
    assert first.startswith("---\ntheme: default\n")


def test_committed_deck_matches_the_committed_results():
    assert not write_slides(ROOT, check=True), "slides/slides.md is stale: run `python -m slides.generate`"


def test_committed_pdf_is_built_from_the_committed_deck():
    """The README links the PDF: a deck, style or plot changed since its export makes it stale."""
    assert (ROOT / PDF).read_bytes().startswith(b"%PDF-")
    built_from = (ROOT / PDF_SOURCES).read_text().strip()
    assert built_from == talk_digest(ROOT), f"{PDF} is stale: run `python -m slides.generate --pdf`"


def test_talk_digest_changes_with_a_plot_the_deck_shows(tmp_path):
    for path in ("slides/slides.md", "slides/style.css", "assets/jpeg_store.png"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    (tmp_path / "slides/slides.md").write_text('<img class="plot" src="/jpeg_store.png"/>')
    before = talk_digest(tmp_path)
    with open(tmp_path / "assets/jpeg_store.png", "ab") as plot:
        plot.write(b"\0")
    assert talk_digest(tmp_path) != before


def test_numbers_come_from_the_results():
    deck = render_slides(ROOT)
    store = _results("jpeg_store")
    ours, stock = _store_rate(store, "raw_crop_host"), _store_rate(store, "stock")
    assert f"**{ours:,.0f}** against **{stock:,.0f}** images/s" in deck  # the headline
    assert f"# {ours / stock:.1f}x" in deck
    quality = next(row for row in _results("jpeg_quality")["rows"] if row["quality"] == 3)
    assert f"{quality['psnr_db']:.1f} dB" in deck
    build = _results("build_memmap")["results"][0]
    assert f"{build['images_per_second']['gpuload']['median']:,.0f}" in deck


def test_one_loader_measurement_feeds_every_slide():
    """Every loader rate on the slides is jpeg_store's: bench_cpu, bench_jpeg_cpu and memmap_vs_folder (other
    runs of the same loaders) are not quoted, and the contenders carry jpeg_store's LABELS."""
    from experiments.jpeg_store import LABELS

    deck = render_slides(ROOT)
    for name in ("bench_cpu", "bench_jpeg_cpu"):
        for result in _results(name)["results"].values():
            assert f"{result['images_per_second']:,.0f} " not in deck, name
    ladder = [slide for slide in _slides(deck) if "# The ladder: " in slide]
    assert len(ladder) == 1
    elsewhere = deck.replace(ladder[0], "")
    for row in _results("memmap_vs_folder")["rows"]:  # the ladder's own measurement, on its slide only
        assert f"{row['images_per_second']['median']:,.0f} images/s" not in elsewhere
    for contender in ("raw", "raw_crop_host", "jpeg_crop", "stock"):
        assert LABELS[contender] in deck, contender
    for old in ("talk_recipe", "tensorclass + Collate", "gpuload.Collate", "tutorial recipe`"):
        assert old not in deck, old


def _prose(template: str) -> str:
    """The template's words: headmatter, code, diagrams, placeholders and markup taken out (notes kept)."""
    prose = template.split("---", 2)[2]
    prose = re.sub(r"^Time: [\d.]+ min\.", "", prose, flags=re.MULTILINE)  # the speaker's plan, not a number measured
    for code_or_markup in (r"```.*?```", r"<svg.*?</svg>", r"\$\{\w+\}", r"`[^`\n]*`", r"<[a-zA-Z/][^>]*>"):
        prose = re.sub(code_or_markup, "", prose, flags=re.DOTALL)
    return prose


def test_the_template_types_no_number_of_its_own():
    """Numbers on the slides and in the notes come from the results: the template's prose holds none
    (code examples and the diagrams' coordinates aside)."""
    prose = _prose((ROOT / TEMPLATE).read_text())
    assert re.findall(r"(?<![\w.])\d[\d.,]*", prose) == []
    assert re.findall(r"(?<![\w.])\d", _prose("---\nx: 1\n---\nabout 3 ms\n```\n42\n```\n<!-- 7 -->")) == ["3", "7"]


def test_a_changed_result_changes_the_deck(talk_repo):
    path = talk_repo / "assets" / "results" / "jpeg_store.json"
    store = json.loads(path.read_text())
    for row in store["rows"]:
        if (row["contender"], row["cache"]) == ("raw_crop_host", "warm"):
            row["images_per_second"]["median"] = 12345.0
    path.write_text(json.dumps(store))
    deck = render_slides(talk_repo)
    assert "**12,345** against" in deck
    assert f"# {times(12345.0 / _store_rate(store, 'stock'))}" in deck  # the big number, as the README writes it


def test_a_missing_result_is_an_error_naming_its_command(bare_repo):
    with pytest.raises(ValueError, match=r"assets/results/\w+\.json, which is missing: run `python -m experiments"):
        render_slides(bare_repo)


def test_a_result_without_a_contender_is_named(talk_repo):
    """A jpeg_store run older than the talk's contender names fails loudly, naming what is missing."""
    path = talk_repo / "assets" / "results" / "jpeg_store.json"
    store = json.loads(path.read_text())
    store["rows"] = [row for row in store["rows"] if row["contender"] != "raw_crop_host"]
    path.write_text(json.dumps(store))
    with pytest.raises(ValueError, match=r"jpeg_store.json has no 'raw_crop_host' row \(warm page cache\).*rerun"):
        render_slides(talk_repo)


def test_a_result_without_the_expected_fields_is_named(talk_repo):
    machine = _results("decoders")["machine"]
    (talk_repo / "assets" / "results" / "decoders.json").write_text(json.dumps({"machine": machine}))
    with pytest.raises(ValueError, match=r"decoders.json.* lacks what the decoders slides read .*rerun `python -m"):
        render_slides(talk_repo)


def test_a_missing_plot_is_an_error(talk_repo):
    (talk_repo / "assets" / "decode_costs.png").unlink()
    with pytest.raises(ValueError, match=r"assets/decode_costs.png, which is missing"):
        render_slides(talk_repo)


def test_cpu_results_say_what_they_are():
    """The GPU measurements are listed once, on one slide, with the one command that makes them, and
    what the committed GPU results measured (on which GPU) or that none did; no other slide sends the
    audience to a GPU run."""
    deck = render_slides(ROOT)
    slides = _slides(deck)
    owed = [slide for slide in slides if GPU_CHECK in slide]
    gpu = json.loads((ROOT / "assets" / "results" / "gpu_check_cuda.json").read_text())["gpu"]
    assert len(owed) == 1 and "# What the GPU run measured" in owed[0] and f"On {gpu}, " in owed[0]
    assert "experiments.run --device cuda" not in deck and "CPU stand-in" not in deck
    assert "cuda_first" not in deck and "x.cuda()" not in deck
    titles = re.findall(r"^# (.+)$", deck, flags=re.MULTILINE)
    assert not [title for title in titles if re.search(r"\bGPU\b.*\b(faster|slower|limit)\b", title)]


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


def _main_slides(slides: list[str]) -> list[str]:
    """The slides before the backup's divider (its title is ``BACKUP``)."""
    divider = [index for index, slide in enumerate(slides) if re.search(rf"^# {BACKUP}$", slide, flags=re.MULTILINE)]
    assert len(divider) == 1, "one backup divider"
    return slides[: divider[0]]


def test_the_talk_fits_its_length_and_every_slide_has_notes():
    slides = _slides(render_slides(ROOT))
    main = _main_slides(slides)
    assert len(main) <= MAX_SLIDES
    minutes = 0.0
    for number, slide in enumerate(slides, 1):
        notes = re.search(r"<!--((?:(?!-->).)*)-->\s*$", slide, flags=re.DOTALL)
        assert notes and len(notes.group(1).split()) >= 20, f"slide {number} has no speaker notes at its end"
        timing = re.match(r"\s*Time: (?:([\d.]+) min|backup, on a question)\. Point: [^\n]+\n", notes.group(1))
        assert timing, f"slide {number}'s notes do not open with its time and its point"
        assert (timing.group(1) is None) == (number > len(main)), f"slide {number}: a time on the main slides only"
        minutes += float(timing.group(1) or 0)
    assert minutes == TALK_MINUTES


def test_the_backup_notes_hold_a_q_and_a_crib():
    slides = _slides(render_slides(ROOT))
    divider = slides[len(_main_slides(slides))]
    for question in ("headline fair", "two cores", "photos", "Accuracy after re-encoding", "GPU", "DALI", "FFCV"):
        assert question in divider, question


def test_cores_per_gpu_come_from_the_results_and_a_quoted_rate():
    """Images per core-second (a rate over the machine's cores) against one GPU's published training rate,
    which says it is quoted and where from."""
    deck = render_slides(ROOT)
    assert GPU_TRAINING["quoted_not_measured"] is True
    assert GPU_TRAINING["url"].startswith("https://") and GPU_TRAINING["url"] in deck
    (slide,) = [slide for slide in _slides(deck) if "# Cores per GPU" in slide]
    store = _results("jpeg_store")
    cores = store["machine"]["cores"]
    for contender in ("stock", "jpeg_crop_exact", "raw_crop_host", "raw"):
        per_core = _store_rate(store, contender) / cores
        assert f"| {per_core:,.0f} | **{GPU_TRAINING['images_per_second'] / per_core:.1f}** |" in slide, contender
    assert "quoted, not measured" in slide


def test_the_headline_says_its_conditions_and_range():
    deck = render_slides(ROOT)
    (slide,) = [slide for slide in _slides(deck) if re.search(r"^# [\d.]+x$", slide, flags=re.MULTILINE)]
    body = slide.split("<!--")[0]
    store = _results("jpeg_store")
    cold = _store_rate(store, "raw_crop_host", "cold") / _store_rate(store, "stock", "cold")
    assert f"Cold cache: **{times(cold)}**" in body
    assert "page cache warm" in body and "CPU" in body and "the JPEG bytes" in body
    ours = next(row for row in store["rows"] if (row["contender"], row["cache"]) == ("raw_crop_host", "warm"))
    stock = next(row for row in store["rows"] if (row["contender"], row["cache"]) == ("stock", "warm"))
    ratios = [a / b for a, b in zip(ours["images_per_second"]["runs"], stock["images_per_second"]["runs"])]
    assert f"{times(min(ratios))}-{times(max(ratios))}" in body
    assert "only the box's rows at a reduced DCT scale" in slide


def test_claims_about_others_are_sourced_or_dropped():
    deck = render_slides(ROOT)
    assert "no longer maintained" not in deck and "three bugs" not in deck
    assert f"{_results('jpeg_store')['ffcv_quoted_not_measured']['ffcv']:,}" not in deck  # a figure with no source
    (peers,) = [slide for slide in _slides(deck) if "# How it compares" in slide]
    for credited in ("data_prefetcher", "PrefetchLoader", "ToTorchImage", "NormalizeImage", "s3://"):
        assert credited in peers, credited
    assert "https://docs.nvidia.com/deeplearning/dali" in peers


def test_the_stock_loader_hands_batches_over_through_shared_memory():
    """The stock loader collates in its workers and passes each batch through shared memory; the talk
    never says it pickles every sample."""
    deck = render_slides(ROOT)
    assert "no pickling" not in deck and "would add pickling" not in deck
    assert "collates each batch in a worker" in deck


def test_the_closing_slide_has_the_install_line_the_repository_and_a_qr_code():
    slides = _slides(render_slides(ROOT))
    closing = _main_slides(slides)[-1]
    assert "`pip install -e .` in a clone" in closing and "not on PyPI" in closing
    assert (ROOT / QR).is_file() and (ROOT / QR).read_text().startswith("<svg")
    assert f'src="/{QR.name}"' in closing
    assert re.search(r"https://github\.com/[\w.-]+/gpuload", closing)


def test_every_plot_slide_has_one_takeaway_line():
    for deck in (render_slides(ROOT), (ROOT / DECK).read_text()):
        for slide in _slides(deck):
            if '<img class="plot"' in slide:
                assert slide.count('<div class="gl-takeaway">') == 1, slide[:200]


def test_never_four_code_slides_in_a_row():
    run = 0
    for slide in _slides(render_slides(ROOT)):
        run = run + 1 if "```python" in slide else 0
        assert run < 4, slide[:200]


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_code_excerpts_are_short_and_narrow(name):
    lines = SNIPPETS[name].lines(ROOT)
    shown = sum(-(-len(line) // CODE_COLUMNS) for line in lines)  # a line longer than the slide wraps
    assert shown <= 8, f"{name}: {shown} lines as shown"
    assert max(map(len, lines)) <= 2 * CODE_COLUMNS, f"{name}: {max(lines, key=len)!r}"


def _written_code(language: str) -> list[str]:
    """The code blocks the template writes itself (not cut from the source)."""
    return re.findall(rf"^```{language}\n(.*?)^```", (ROOT / TEMPLATE).read_text(), flags=re.MULTILINE | re.DOTALL)


def test_written_code_fits_the_slide():
    blocks = _written_code(r"\w+")
    assert len(blocks) >= 4
    for block in blocks:
        lines = block.splitlines()
        assert len(lines) <= CODE_LINES, block
        assert max(map(len, lines)) <= CODE_COLUMNS, max(lines, key=len)


def test_written_python_uses_gpuload_as_it_is():
    """The examples the talk writes (training loop, Normalize, profiler) parse, and every ``gpuload.X``
    they call exists and accepts the keywords they pass."""
    import gpuload

    calls = 0
    for block in _written_code("python"):
        for node in ast.walk(ast.parse(block.replace("...", "pass"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gpuload":
                assert hasattr(gpuload, node.attr), f"gpuload has no {node.attr}"
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "gpuload"
            ):
                target = getattr(gpuload, node.func.attr)
                keywords = {keyword.arg: None for keyword in node.keywords}
                inspect.signature(target).bind_partial(*[None] * len(node.args), **keywords)
                calls += 1
    assert calls >= 4


def test_the_cli_lines_are_gpuload_commands():
    from gpuload.cli import main as cli_main

    (block,) = _written_code("bash")
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.startswith("gpuload ")]
    assert len(commands) == 3
    for command in commands:  # each parses: --help exits 0 for a known subcommand
        with pytest.raises(SystemExit) as exit_:
            cli_main([command[1], "--help"])
        assert exit_.value.code == 0


def test_code_and_text_sizes_in_the_style():
    style = (SLIDES / "style.css").read_text()
    assert re.search(r"--slidev-code-font-size:\s*(\d+)px", style).group(1) == str(CODE_PX)
    sizes = [int(size) for size in re.findall(r"font-size:\s*(\d+)px", style)]
    assert min(sizes) >= SMALLEST_PX
    assert "lineNumbers: false" in (ROOT / TEMPLATE).read_text()  # line numbers would take the width
    classes = set(re.findall(r'class="([^"]+)"', (ROOT / TEMPLATE).read_text()))
    ours = {name for value in classes for name in value.split()}
    assert all(name.startswith("gl-") for name in ours), ours  # UnoCSS makes utilities of bare words


def test_plots_are_shown_at_the_size_they_were_drawn():
    deck = (ROOT / DECK).read_text()
    images = re.findall(r'<img class="plot" src="/([^"]+)" width="(\d+)" height="(\d+)"', deck)
    assert len(images) >= 6
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
    assert _common.MIN_FONT_PX >= PLOT_PX and _common.CANVAS[0] == CANVAS_WIDTH
    fig, axes = _common.figure(1, 2, size=(900, 360))
    assert tuple(fig.get_size_inches() * fig.dpi) == (900, 360)
    assert fig.dpi == 72  # 1 pt is 1 px of the canvas
    import matplotlib.pyplot as plt

    for key in _common.FONT_SIZES:
        assert plt.rcParams[key] >= PLOT_PX, key
    monkeypatch.setattr(_common, "ASSETS", tmp_path)
    axes[0][0].set_title("too small to read", fontsize=10)
    with pytest.raises(ValueError, match="too small to read.* at 10.0 px"):
        _common.save_figure(fig, "small", _results("transfer_order"))
    assert not (tmp_path / "small.png").exists()
    fig, axes = _common.figure()
    fig.suptitle("a_title_with_no_space_far_too_long_for_the_figure" * 3)  # wrapped at spaces, it has none
    with pytest.raises(ValueError, match="wider than the figure"):
        _common.save_figure(fig, "wide", _results("transfer_order"))
    with pytest.raises(ValueError, match="must fit the 980x552 slide canvas"):
        _common.figure(size=(1280, 720))


def _synthetic(name: str) -> dict:
    """Results of the experiments whose JSON is not committed yet, to draw their plots."""
    machine = _results("transfer_order")["machine"]
    spread = {"median": 900.0, "min": 800.0, "max": 1000.0, "runs": [900.0]}
    if name == "jpeg_store":
        contenders = (
            "stock",
            "spdl",
            "jpeg_crop",
            "jpeg_crop_exact",
            "jpeg_full",
            "raw_crop_host",
            "raw_crop_device",
            "raw",
        )
        rows = [
            {"contender": contender, "cache": cache, "images_per_second": spread, "megabytes_per_second": spread}
            for contender in contenders
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
    "decode_costs": ["decode_costs"],
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
    assert "    return torch.addcmul(self.shift, images, self.scale)\n```" in deck


def test_placeholders_must_match(talk_repo):
    template = talk_repo / TEMPLATE
    text = template.read_text()
    template.write_text(text + "\n${no_such_value}\n")
    with pytest.raises(ValueError, match="no_such_value"):
        render_slides(talk_repo)
    template.write_text(text.replace("${limits_list}", ""))
    with pytest.raises(ValueError, match="does not use: \\['limits_list'\\]"):
        render_slides(talk_repo)


def test_the_speaker_and_the_repository_fill_the_title(talk_repo):
    template = talk_repo / TEMPLATE
    template.write_text(template.read_text().replace("speaker: gpuload team", "speaker: Ada Lovelace"))
    assert "Ada Lovelace · https://github.com/gpuload/gpuload" in render_slides(talk_repo)  # the template's
    readme = talk_repo / "README.md"
    readme.write_text(readme.read_text() + "\nCode: https://github.com/someone/gpuload\n")
    assert "Ada Lovelace · https://github.com/someone/gpuload" in render_slides(talk_repo)
    template.write_text(template.read_text().replace("speaker: Ada Lovelace\n", ""))
    with pytest.raises(ValueError, match="has no `speaker:`"):
        render_slides(talk_repo)


def test_the_peers_come_from_the_readme_when_it_compares_them(talk_repo):
    readme = talk_repo / "README.md"
    table = (
        "| feature | gpuload | DALI | FFCV | timm | WebDataset |\n|---|---|---|---|---|---|\n| x | a | b | c | d | e |"
    )
    readme.write_text(readme.read_text() + "\n\n" + table + "\n\nAfter.\n")
    deck = render_slides(talk_repo)
    assert table in deck and "From the README's comparison" in deck


def test_outside_the_repository_it_says_where_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run this in the gpuload repository"):
        render_slides(tmp_path)


def test_invalid_result_json_names_the_file(talk_repo):
    (talk_repo / "assets" / "results" / "train_order.json").write_text("{not json")
    with pytest.raises(ValueError, match="train_order.json is not valid JSON"):
        render_slides(talk_repo)


def test_write_slides_writes_once(talk_repo):
    assert write_slides(talk_repo, check=True)
    assert not (talk_repo / DECK).exists()  # check only compares
    assert write_slides(talk_repo)
    assert not write_slides(talk_repo)
    assert {path.name for path in (talk_repo / "slides").iterdir()} == {"template.md", "slides.md"}  # no temporary


def test_gpu_results_are_marked_on_the_gpu_slide(talk_repo):
    """A GPU run's results (bench_cuda.json, <name>_cuda.json) are marked as measured on the one slide
    that lists what a GPU run adds, and bench_cuda's copy limit fills the overlap slide."""
    results = talk_repo / "assets" / "results"
    for committed in results.glob("*_cuda.json"):  # a GPU run that measured only the bench
        committed.unlink()
    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0"}
    bench = _results("bench_cpu")
    bench["machine"].update(gpu)
    bench["device"] = "cuda"
    bench["results"]["limit_h2d"] = dict(bench["results"]["gpuload"], images_per_second=4 * 12345.0)
    bench["results"]["gpuload"]["images_per_second"] = 12345.0
    (results / "bench_cuda.json").write_text(json.dumps(bench))
    deck = render_slides(talk_repo)
    date = bench["machine"]["date"][:10]
    assert f"{dict(GPU_OWED)['bench_cuda']} ({date})" in deck
    assert f"On NVIDIA H100 80GB HBM3, 1 of {len(GPU_OWED)} measured, {len(GPU_OWED) - 1} still owed:" in deck
    assert f"{dict(GPU_OWED)['train_order_cuda']}\n" in deck  # not measured: no date
    assert "the loader reaches 25 % of the pinned host-to-device copy limit" in deck
    assert "No GPU has run these experiments yet" not in deck
    assert "GPU results on the slide that lists them." in deck


def test_generate_check_and_write(capsys, talk_repo, bare_repo):
    assert generate_main(["--repo", str(ROOT), "--check"]) == 0
    assert "is up to date" in capsys.readouterr().out
    (talk_repo / "slides" / "slides.md").write_text("old talk")
    assert generate_main(["--repo", str(talk_repo), "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert generate_main(["--repo", str(talk_repo)]) == 0
    assert capsys.readouterr().out.startswith("wrote ")
    assert set(HOW_TO_MEASURE) <= {path.stem for path in (ROOT / "assets" / "results").glob("*.json")}


def test_generate_outside_the_repository(capsys, tmp_path):
    assert generate_main(["--repo", str(tmp_path)]) == 2
    assert "run this in the gpuload repository" in capsys.readouterr().err


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


@pytest.fixture
def served_deck(built_deck: Path):
    """The built deck on 127.0.0.1 for one test (its thread stopped and joined after it)."""
    handler = functools.partial(_QuietHandler, directory=str(built_deck))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


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


# What the browser measures on the slide shown (canvas px: the canvas is scaled to the window by a transform).
_MEASURE = """(selector) => {
    const slide = document.querySelector(selector);
    const canvas = slide.querySelector('.slidev-layout');
    const layout = canvas.getBoundingClientRect();
    const scale = layout.width / canvas.offsetWidth;
    const title = slide.querySelector('h1');
    const parts = [...slide.querySelectorAll('.slidev-layout h1, p, li, pre, img, table, svg')];
    const texts = [];
    const walker = document.createTreeWalker(slide, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const element = node.parentElement;
        const characters = node.textContent.replace(/\\s+/g, '').length;
        if (!characters || !element.getClientRects().length) continue;
        const style = getComputedStyle(element);
        if (style.visibility === 'hidden' || parseFloat(style.opacity) === 0) continue;
        texts.push({size: parseFloat(style.fontSize), characters, code: !!element.closest('pre'),
                    small: !!element.closest('.gl-source, .snippet-source, .gl-chapter, .gl-machine'),
                    label: !!element.closest('.gl-pipeline, .gl-legend, .gl-vm, svg'),
                    sample: node.textContent.trim().slice(0, 40)});
    }
    const chapter = slide.querySelector('.gl-chapter');
    const words = (element) => {  // the box of an element's text, not of its block
        if (!element) return null;
        const range = document.createRange();
        range.selectNodeContents(element);
        return range.getBoundingClientRect();
    };
    const overlaps = (a, b) => a && b && !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top);
    return {
        body: slide.innerText.replace(title ? title.innerText : '', '').trim(),
        images: [...slide.querySelectorAll('img')].map(i => ({src: i.src, complete: i.complete, width: i.naturalWidth})),
        below: parts.filter(e => e.getBoundingClientRect().bottom > layout.bottom + 1).map(e => e.tagName),
        right: parts.filter(e => e.getBoundingClientRect().right > layout.right + 1).map(e => e.tagName),
        wide: [...slide.querySelectorAll('pre')].filter(e => e.scrollWidth > e.clientWidth + 1).length,
        canvasWidth: canvas.offsetWidth,
        texts: texts,
        scale: scale,
        frames: [...slide.querySelectorAll('*')].filter(e => {
            const style = getComputedStyle(e);
            return style.boxShadow !== 'none' || (style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0);
        }).map(e => e.tagName + '.' + String(e.className.baseVal ?? e.className)),
        chapterOverTitle: overlaps(words(chapter), words(title)),
        plots: [...slide.querySelectorAll('img.plot')].map(i => ({
            src: i.src, natural: i.naturalWidth, shown: i.getBoundingClientRect().width / scale,
        })),
    };
}"""


@pytest.mark.slides
def test_every_slide_renders_in_chromium(served_deck):
    """Every slide of the built deck at 1280x720, every click shown: it loads everything from this machine,
    stays on the canvas, keeps text, code and plots at the back row's sizes, has no frame that no style of
    ours drew, and its screenshot is kept; then the sizes of the whole deck."""
    from playwright.sync_api import sync_playwright

    slides = _slide_count((ROOT / DECK).read_text())
    assert len(_main_slides(_slides((ROOT / DECK).read_text()))) <= MAX_SLIDES
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"]  # fmt: skip
    problems: list[str] = []
    report: dict[int, dict] = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for stale in SCREENSHOTS.glob("slide-*.png"):  # a longer deck's screenshots must not pass for this one's
        stale.unlink()
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
            content = page.evaluate(_MEASURE, selector)
            problems += _slide_problems(number, content)
            report[number] = _sizes(content["texts"])
            screenshot = SCREENSHOTS / f"slide-{number:02d}.png"
            page.screenshot(path=str(screenshot))
            if not (content["body"] or content["images"]) or _inked(screenshot) < 0.01:
                problems.append(f"slide {number} is blank: {content['body']!r}, {_inked(screenshot):.1%} inked")
        page.goto(f"{served_deck}#/{slides + 1}", wait_until="networkidle")  # one past the last: no such slide
        page.wait_for_timeout(600)
        beyond = page.query_selector(f".slidev-page-{slides + 1}")
        browser.close()
    (SCREENSHOTS / "sizes.json").write_text(json.dumps(report, indent=1))
    assert beyond is None, f"the browser shows more slides than the Markdown's {slides}"
    text = sum(sizes["text_characters"] for sizes in report.values())
    large = sum(sizes["large_characters"] for sizes in report.values())
    if large < TEXT_SHARE * text:
        problems.append(f"only {large / text:.0%} of the deck's text is at {TEXT_PX} px or more, not {TEXT_SHARE:.0%}")
    assert not problems, "\n".join(problems)


def _sizes(texts: list[dict]) -> dict:
    """A slide's characters of body text (code, small print and diagram labels aside) and of them those at
    ``TEXT_PX`` or more."""
    prose = [text for text in texts if not (text["code"] or text["small"] or text["label"])]
    return {
        "text_characters": sum(text["characters"] for text in prose),
        "large_characters": sum(text["characters"] for text in prose if text["size"] >= TEXT_PX - 0.01),
        "smallest_px": min((text["size"] for text in texts), default=None),
        "code_px": min((text["size"] for text in texts if text["code"]), default=None),
    }


def _slide_problems(number: int, content: dict) -> list[str]:
    """What the back row, or the browser, would hold against one slide."""
    problems = []
    if content["below"]:
        problems.append(f"slide {number}: runs off the bottom: {content['below']}")
    if content["right"]:
        problems.append(f"slide {number}: runs off the right: {content['right']}")
    if content["wide"]:
        problems.append(f"slide {number}: {content['wide']} code block(s) wider than the slide")
    for image in content["images"]:
        if not image["complete"] or image["width"] == 0:
            problems.append(f"slide {number}: image not loaded: {image['src']}")
    if content["canvasWidth"] != CANVAS_WIDTH:
        problems.append(f"slide {number}: the canvas is {content['canvasWidth']} px wide, not {CANVAS_WIDTH}")
    if content["frames"]:
        problems.append(f"slide {number}: a frame or shadow no style of ours drew: {content['frames']}")
    if content["chapterOverTitle"]:
        problems.append(f"slide {number}: the chapter label overlaps the title")
    for text in content["texts"]:
        floor = CODE_PX if text["code"] else SMALLEST_PX if text["small"] else LABEL_PX if text["label"] else TEXT_PX
        if text["size"] < floor - 0.01:
            problems.append(f"slide {number}: {text['sample']!r} at {text['size']:.1f} px, under {floor}")
    sizes = _sizes(content["texts"])
    if (
        sizes["text_characters"] >= SLIDE_PROSE
        and sizes["large_characters"] < SLIDE_TEXT_SHARE * sizes["text_characters"]
    ):
        share = sizes["large_characters"] / sizes["text_characters"]
        problems.append(f"slide {number}: only {share:.0%} of its text at {TEXT_PX} px or more")
    for plot in content["plots"]:
        # drawn at natural / PLOT_DENSITY canvas px with text of at least PLOT_PX: shown smaller, it shrinks
        if plot["shown"] < plot["natural"] / PLOT_DENSITY - 1:
            problems.append(
                f"slide {number}: {plot['src']} shown {plot['shown']:.0f} px wide, drawn for "
                f"{plot['natural'] / PLOT_DENSITY:.0f}: its text is under {PLOT_PX} px"
            )
    return problems


def test_slides_about_gpu_behaviour_quote_the_lease_or_say_not_measured(talk_repo):
    """Each main slide about what happens on a GPU quotes the GPU lease on the slide itself, or says, in one
    line, that it was not measured on a GPU (as it does with no GPU result)."""
    gpu = _results("gpu_check_cuda")["machine"]["gpu"]
    titles = ("# A ring of pinned buffers", "# Ship uint8", "# Crop where it is cheapest", "# The ladder")
    for deck, said in ((render_slides(ROOT), f"{gpu}"), (None, "not measured on a GPU")):
        if deck is None:  # the same talk before any GPU run
            for result in (talk_repo / "assets" / "results").glob("*_cuda.json"):
                result.unlink()
            deck = render_slides(talk_repo)
        for title in titles[:3]:
            (slide,) = [slide for slide in _slides(deck) if title in slide]
            assert said.lower() in slide.split("<!--")[0].lower(), (title, said)


def test_the_qr_code_is_written_from_the_repository_address(talk_repo):
    """``generate`` writes the QR code of the template's ``repository:`` (segno, offline) before the deck
    that shows it; a template without a URL writes none and shows none."""
    pytest.importorskip("segno")
    from slides.generate import write_qr

    (talk_repo / QR).unlink()
    assert write_qr(talk_repo) == talk_repo / QR
    assert (talk_repo / QR).read_text().startswith("<svg") and (talk_repo / QR).read_text() == (ROOT / QR).read_text()
    template = talk_repo / TEMPLATE
    template.write_text(re.sub(r"^repository: .*\n", "", template.read_text(), flags=re.MULTILINE))
    (talk_repo / QR).unlink()
    assert write_qr(talk_repo) is None and not (talk_repo / QR).exists()
    deck = render_slides(talk_repo)
    assert "gl-qr" not in deck and "`pip install -e .` in a clone (not on PyPI)" in deck


def test_where_it_does_not_help_names_the_gpu_machine_where_the_stock_loader_won():
    gpu = _results("jpeg_store_cuda")
    ours, stock = _store_rate(gpu, "jpeg_crop"), _store_rate(gpu, "stock")
    (slide,) = [slide for slide in _slides(render_slides(ROOT)) if "# Where it does not help" in slide]
    if ours < stock:
        assert f"made {ours:,.0f} crops/s, the stock loader {stock:,.0f}" in slide
