"""Code for the talk's slides, cut from the project's source files when the deck is generated."""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Snippet", "SnippetError"]


class SnippetError(ValueError):
    """A snippet names a file, symbol or text that is not in the source (the code moved on)."""


@dataclass(frozen=True)
class Snippet:
    """A function or class of a source file, as a Slidev code block with line-highlight steps.

    Args:
        path: the file, relative to the repository root.
        symbol: a module-level function, class or assignment, or a method as ``"Class.method"``.
        start: keep from the first line that contains this text (default: the symbol's first line).
        end: keep up to the first line from ``start`` on that contains this text (default: the last).
        steps: Slidev click steps between two views of the whole block: each highlights the
            lines that contain any of its texts.
        docstring: keep the symbol's docstring (default: dropped, slides are short).
        comments: keep the source's comments (default: kept; dropped, a slide's lines are shorter and
            the speaker says what they said).
        max_height: CSS height above which the block scrolls, e.g. ``"380px"``.

    Example:
        >>> root = Path(__file__).resolve().parent.parent  # the repository
        >>> snippet = Snippet("gpuload/transforms/normalize.py", "Normalize.forward", steps=(("return torch.addcmul",),))
        >>> snippet.lines(root)[0]
        'def forward(self, images: torch.Tensor) -> torch.Tensor:'
        >>> snippet.markdown(root).splitlines()[2]
        '```python {all|6-7|all}'
    """

    path: str
    symbol: str
    start: str | None = None
    end: str | None = None
    steps: tuple[tuple[str, ...], ...] = ()
    docstring: bool = False
    comments: bool = True
    max_height: str | None = None

    def lines(self, root: Path) -> list[str]:
        """The snippet's source lines, dedented."""
        source = (root / self.path).read_text().splitlines()
        node = self._find(ast.parse("\n".join(source), self.path))
        first = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", [])])
        numbers = list(range(first, node.end_lineno + 1))
        docstring = ast.get_docstring(node, clean=False) if hasattr(node, "body") else None
        if docstring is not None and not self.docstring:
            expression = node.body[0]
            after = expression.end_lineno + 1  # and the blank line that follows it
            blank = after <= node.end_lineno and not source[after - 1].strip()
            numbers = [n for n in numbers if not expression.lineno <= n <= expression.end_lineno + blank]
        lines = [source[n - 1] for n in numbers]
        begin = self._index(lines, self.start, 0) if self.start else 0
        stop = self._index(lines, self.end, begin) + 1 if self.end else len(lines)
        lines = textwrap.dedent("\n".join(lines[begin:stop])).splitlines()
        return lines if self.comments else _without_comments(lines)

    def markdown(self, root: Path) -> str:
        """A caption naming the source and the fenced ``python`` block with its steps."""
        lines = self.lines(root)
        steps = [_ranges(self._matching(lines, texts)) for texts in self.steps]
        ranges = ["all", *steps, "all"] if steps else ["all"]  # ends on the whole block, as a PDF page shows it
        options = f"{{maxHeight:'{self.max_height}'}}" if self.max_height else ""
        header = f"```python {{{'|'.join(ranges)}}}{options}" if self.steps or options else "```python"
        caption = f'<p class="snippet-source">{self.path} · {self.symbol}</p>'
        return "\n".join([caption, "", header, *lines, "```"])

    def _find(self, tree: ast.Module) -> ast.stmt:
        body: list[ast.stmt] = tree.body
        node = None
        for name in self.symbol.split("."):
            found = [child for child in body if name in _names(child)]
            if not found:
                raise SnippetError(f"{self.path} has no {self.symbol}")
            node = found[0]
            body = getattr(node, "body", [])
        return node

    def _index(self, lines: list[str], text: str, begin: int) -> int:
        for index in range(begin, len(lines)):
            if text in lines[index]:
                return index
        raise SnippetError(f"no line of {self.path}:{self.symbol} contains {text!r}")

    def _matching(self, lines: list[str], texts: tuple[str, ...]) -> list[int]:
        numbers = [number for number, line in enumerate(lines, 1) if any(text in line for text in texts)]
        if not numbers:
            raise SnippetError(f"no line of the {self.path}:{self.symbol} snippet contains any of {texts}")
        return numbers


def _names(node: ast.stmt) -> list[str]:
    """The names a statement defines: a function's or class's, or an assignment's targets."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [target.id for target in node.targets if isinstance(target, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _without_comments(lines: list[str]) -> list[str]:
    """``lines`` with their ``#`` comments cut (a line that held only a comment dropped), found by
    Python's tokenizer, so a ``#`` inside a string stays."""
    comments: dict[int, int] = {}  # line index -> the column its comment starts at
    try:
        for token in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0] - 1] = token.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a cut that ends inside a bracket: the comments found up to there are cut
    kept = []
    for index, line in enumerate(lines):
        if index in comments:
            line = line[: comments[index]].rstrip()
            if not line:
                continue
        kept.append(line)
    return kept


def _ranges(numbers: list[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``"2-4,7"``."""
    parts: list[list[int]] = []
    for number in numbers:
        if parts and number == parts[-1][1] + 1:
            parts[-1][1] = number
        else:
            parts.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
