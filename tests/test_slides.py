"""The talk: ``python -m slides.generate`` output, and the built deck opened slide by slide in headless Chromium."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from slides.generate import DECK, HOW_TO_MEASURE, SNIPPETS, TEMPLATE, render_slides, write_slides
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
    assert not write_slides(ROOT, check=True), "slides/slides.md is stale: run `gpuload slides`"


def test_numbers_come_from_the_results():
    deck = render_slides(ROOT)
    bench = _results("bench_cpu")["results"]
    assert f"{bench['gpuload']['images_per_second']:,.0f} images/s" in deck
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
    assert "`gpuload.DataLoader`: **12,345 images/s**" in render_slides(bare_repo)


def test_missing_results_and_plots_are_said_plainly(bare_repo):
    deck = render_slides(bare_repo)
    for name in HOW_TO_MEASURE:
        assert f"there is no `assets/results/{name}.json`" in deck, name
    assert "<img" not in deck
    assert "**No plot yet:** `assets/transfer_order.png`" in deck
    assert not re.search(r"\d+ images/s", deck)  # no rate without a result


def test_a_cpu_only_run_says_the_gpu_results_are_missing():
    deck = render_slides(ROOT)
    if any(_results(name)["machine"]["gpu"] for name in ("memmap_vs_folder", "bench_cpu")):
        pytest.skip("the committed results come from a GPU machine")
    assert "there is no `assets/results/bench_cuda.json`" in deck
    assert "**No cuda run yet**" in deck
    assert "No GPU has run these experiments yet" in deck


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
    machine = _results("jpeg_quality")["machine"]
    (bare_repo / "assets" / "results" / "jpeg_quality.json").write_text(json.dumps({"machine": machine}))
    with pytest.raises(ValueError, match="the image_quality slides read .*rerun its experiment"):
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
                    return {
                        body: slide.innerText.replace(title ? title.innerText : '', '').trim(),
                        images: [...slide.querySelectorAll('img')].map(i => ({src: i.src, complete: i.complete, width: i.naturalWidth})),
                        below: parts.filter(e => e.getBoundingClientRect().bottom > layout.bottom + 1).map(e => e.tagName),
                        wide: [...slide.querySelectorAll('pre')].filter(e => e.scrollWidth > e.clientWidth + 1).length,
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
    """The CUDA paths of the generator, on the committed results dressed up as a GPU run."""
    results = bare_repo / "assets" / "results"
    shutil.copytree(ROOT / "assets" / "results", results, dirs_exist_ok=True)
    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0"}
    for path in results.glob("*.json"):
        result = json.loads(path.read_text())
        result["machine"].update(gpu)
        path.write_text(json.dumps(result))
    bench = json.loads((results / "bench_cpu.json").read_text())
    bench["device"] = "cuda"
    bench["results"]["limit_h2d"] = dict(bench["results"]["gpuload"], images_per_second=20000.0)
    (results / "bench_cuda.json").write_text(json.dumps(bench))
    transfer = json.loads((results / "transfer_order.json").read_text())
    transfer["rows"] += [dict(row, memory="pinned") for row in transfer["rows"]]
    (results / "transfer_order.json").write_text(json.dumps(transfer))
    memmap = json.loads((results / "memmap_vs_folder.json").read_text())
    memmap["rows"] += [dict(row, device="cuda") for row in memmap["rows"]]
    memmap["device_names"]["cuda"] = "cuda (NVIDIA H100 80GB HBM3)"
    (results / "memmap_vs_folder.json").write_text(json.dumps(memmap))

    deck = render_slides(bare_repo)
    assert "Not measured yet" not in deck
    assert "No GPU has run these experiments yet" not in deck
    assert "NVIDIA H100 80GB HBM3 (CUDA 13.0)" in deck
    share = f"{100 * bench['results']['gpuload']['images_per_second'] / 20000:.0f} %"
    assert f"reaches **{share}** of the pinned host-to-device limit" in deck
    assert "To cuda (NVIDIA H100 80GB HBM3), " in deck
    assert ", pinned: " in deck  # the transfer example prefers pinned memory on a GPU


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
