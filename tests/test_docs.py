"""The README and the pages of docs/: every relative link reaches a file, and every anchor a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "experiments" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        heading = re.sub(r"[`*]", "", heading).strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", heading).replace(" ", "-"))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target]


def test_the_anchors_of_a_heading_are_githubs():
    assert anchors(ROOT / "README.md") >= {"measured", "which-format-and-where-to-crop"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_reaches_its_file_and_heading(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(target)
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"
