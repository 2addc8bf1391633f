"""Snippets cut from source files for the slides."""

from __future__ import annotations

from pathlib import Path

import pytest

from slides.snippets import Snippet, SnippetError

SOURCE = '''"""A module."""

LIMITS = {
    "low": 1,
    "high": 2,
}


def decorate(function):
    return function


class Loader:
    """Loads."""

    @decorate
    def load(self, path: str) -> bytes:
        """Read ``path``.

        Many lines.
        """

        data = open(path, "rb").read()
        checked = len(data)
        return data[:checked]


def helper() -> int:
    first = 1
    second = 2
    return first + second
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "module.py").write_text(SOURCE)
    return tmp_path


def test_a_method_with_its_decorator_without_its_docstring(root):
    lines = Snippet("pkg/module.py", "Loader.load").lines(root)
    assert lines == [
        "@decorate",
        "def load(self, path: str) -> bytes:",
        '    data = open(path, "rb").read()',
        "    checked = len(data)",
        "    return data[:checked]",
    ]


def test_the_docstring_can_stay(root):
    lines = Snippet("pkg/module.py", "Loader.load", docstring=True).lines(root)
    assert lines[2] == '    """Read ``path``.'
    assert len(lines) == 10


def test_a_module_level_assignment(root):
    assert Snippet("pkg/module.py", "LIMITS").lines(root) == ["LIMITS = {", '    "low": 1,', '    "high": 2,', "}"]


def test_start_and_end_cut_and_dedent(root):
    snippet = Snippet("pkg/module.py", "Loader.load", start="checked =", end="return")
    assert snippet.lines(root) == ["checked = len(data)", "return data[:checked]"]


def test_end_is_searched_from_start(root):
    snippet = Snippet("pkg/module.py", "helper", start="second", end="= ")
    assert snippet.lines(root) == ["second = 2"]


def test_markdown_has_caption_steps_and_height(root):
    snippet = Snippet("pkg/module.py", "helper", steps=(("first =", "second ="), ("return",)), max_height="200px")
    assert snippet.markdown(root).splitlines() == [
        '<p class="snippet-source">pkg/module.py · helper</p>',
        "",
        "```python {all|2-3|4|all}{maxHeight:'200px'}",
        "def helper() -> int:",
        "    first = 1",
        "    second = 2",
        "    return first + second",
        "```",
    ]


def test_non_adjacent_lines_are_listed(root):
    snippet = Snippet("pkg/module.py", "helper", steps=(("def", "return"),))
    assert "```python {all|1,4|all}" in snippet.markdown(root)


def test_plain_block_without_steps(root):
    assert "\n```python\ndef helper" in Snippet("pkg/module.py", "helper").markdown(root)


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        (Snippet("pkg/module.py", "missing"), "pkg/module.py has no missing"),
        (Snippet("pkg/module.py", "Loader.save"), "pkg/module.py has no Loader.save"),
        (Snippet("pkg/module.py", "helper", start="third"), "contains 'third'"),
        (Snippet("pkg/module.py", "helper", end="third"), "contains 'third'"),
    ],
)
def test_code_that_moved_on_is_an_error(root, snippet, message):
    with pytest.raises(SnippetError, match=message):
        snippet.lines(root)


def test_a_step_matching_nothing_is_an_error(root):
    with pytest.raises(SnippetError, match="contains any of"):
        Snippet("pkg/module.py", "helper", steps=(("third",),)).markdown(root)


def test_comments_can_be_cut(root):
    (root / "pkg" / "commented.py").write_text(
        'def f(x):\n    # a whole-line comment\n    y = "#not a comment"  # a trailing one\n    return (x,  # open\n            y)\n'
    )
    assert Snippet("pkg/commented.py", "f", comments=False).lines(root) == [
        "def f(x):",
        '    y = "#not a comment"',
        "    return (x,",
        "            y)",
    ]
    assert Snippet("pkg/commented.py", "f").lines(root)[1] == "    # a whole-line comment"
