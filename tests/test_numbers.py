"""experiments/numbers.py: every measured number of the READMEs comes from the committed results."""

import copy

import pytest

from experiments import numbers


@pytest.fixture(scope="module")
def results() -> dict:
    return numbers.load_results()


def test_the_committed_readmes_match_the_committed_results_and_tag_every_number():
    assert numbers.main(["--check"]) == 0


def test_a_changed_result_changes_its_span_and_its_table(results):
    changed = copy.deepcopy(results)
    row = next(
        row for row in changed["jpeg_store"]["rows"] if (row["contender"], row["cache"]) == ("jpeg_crop", "warm")
    )
    row["images_per_second"]["median"] = 12345.6
    text = (
        "jpeg crops: <!--n jpeg_store.jpeg_crop.warm-->1<!--/n--> images/s\n<!--t which_format-->\nSTALE\n<!--/t-->\n"
    )
    rendered = numbers.render(text, changed)
    assert "<!--n jpeg_store.jpeg_crop.warm-->12,346<!--/n--> images/s" in rendered
    assert "| 12,346 (" in rendered and "STALE" not in rendered
    assert numbers.render(rendered, changed) == rendered  # stable


def test_a_span_naming_nothing_is_an_error_naming_it(results):
    with pytest.raises(KeyError, match="README.md: no result gives the numbers jpeg_store.nothing"):
        numbers.render("<!--n jpeg_store.nothing-->1<!--/n-->", results, "README.md")


@pytest.mark.parametrize(
    "text",
    [
        "gpuload serves 1,234 images/s",
        "3.4x the stock loader",
        "55 % of the decoder",
        "a crop takes 0.24 ms",
        "97.7 MB on disk",
    ],
)
def test_a_number_with_a_unit_outside_a_tag_is_found(text):
    assert numbers.untagged(f"intro\n{text}\n") == [f"line 2: {numbers.MEASURED.search(text)[0]!r}"]


@pytest.mark.parametrize(
    "text",
    [
        "gpuload serves <!--n bench_cpu.gpuload-->1,234<!--/n--> images/s",
        "uint8 moves <!--fact-->4x<!--/fact--> fewer bytes than float32",
        "`--size 480x640` and ```\n12 ms\n```",
        "photos of 640x480, resnet50, batch 256, -q:v 3, 224x224 crops",
    ],
)
def test_tagged_numbers_code_and_plain_numbers_pass(text):
    assert numbers.untagged(text) == []


def test_a_failed_bench_contender_is_a_row_saying_so_and_names_no_number(results):
    changed = copy.deepcopy(results)
    report = changed["bench_cpu"]
    del report["results"]["image_folder"]
    report["failed"] = {"image_folder": "RuntimeError: the disk went away"}
    rendered = numbers.render("<!--t bench_cpu-->\nSTALE\n<!--/t-->\n", changed)
    assert "| torch DataLoader + ImageFolder (JPEGs) | failed: RuntimeError: the disk went away |  |  |  |" in rendered
    known = numbers.values(changed)
    assert "bench_cpu.gpuload" in known and "bench_cpu.image_folder" not in known
    assert "bench_cpu.gpuload.x_stock" not in known  # its stock loader failed


def test_remote_reads_rates_are_the_bytes_fetched_over_the_time(results):
    """A result that records the bytes fetched is read from them; an older one (blocks asked for) still renders."""
    import statistics

    changed = copy.deepcopy(results)
    row = next(
        row
        for row in changed["remote_reads"]["blocks"]
        if (row["client"], row["block_MiB"], row["latency_ms"]) == ("obstore", 1.0, 0.0)
    )
    row["bytes_fetched"] = [111 * 2**20] * len(row["seconds"])  # fewer than the blocks asked for
    row["requests"] = [111] * len(row["seconds"])
    rates = [111 * 2**20 / seconds / 1e6 for seconds in row["seconds"]]
    expected = f"{numbers.count(statistics.median(rates))} ({numbers.count(min(rates))}-{numbers.count(max(rates))})"

    def obstore_cell(result: dict) -> str:
        table = numbers.render("<!--t remote_reads-->\n<!--/t-->\n", result)
        return next(line for line in table.splitlines() if line.startswith("| 1 MiB, 0 ms |")).split(" | ")[1]

    assert obstore_cell(changed).replace("*", "") == expected
    assert obstore_cell(results).replace("*", "") != expected  # the committed result: the blocks asked for


def test_the_scale_tables_first_image_row_says_whether_the_page_cache_was_dropped(results):
    """``--drop-caches`` is asked for (root only): a run without it measured a warm page cache, and the
    table must not call its numbers cold."""
    assert "page cache dropped" in numbers.render("<!--t scale-->\n<!--/t-->\n", results)
    warm = copy.deepcopy(results)
    for row in warm["scale"]["rows"]:
        row["first_image"]["page_cache"] = "as found"
    rendered = numbers.render("<!--t scale-->\n<!--/t-->\n", warm)
    assert "page cache dropped" not in rendered and "page cache as found" in rendered
