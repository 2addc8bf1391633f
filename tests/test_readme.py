"""The README's examples of "Using it", run as a newcomer runs them: every block in the order it
appears, in one folder that holds ``photos/`` and ``val-q3/`` (ImageFolders of real photos), bash
blocks with ``bash -e``, python blocks as scripts (a python block that does not begin with an
import continues the one before it, as a reader pastes it below), the object-storage examples against
a real S3 server on 127.0.0.1 with a bucket named ``bucket``.

What a newcomer would change to fit their machine is in ``ADAPTED``, each with its reason; a
replacement whose text the README no longer holds fails the test, so the table stays true.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from servers import fake_aws_environment

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# (the README's text, what runs here, why)
ADAPTED = [
    ('pip install -e ".[cloud]"', "true", "installed already: the test extra holds the cloud extra's clients"),
    ("/new/place/photos-q3", "$PWD/photos-q3", "where the sources are now: here, where they were"),
    ("/local/nvme/gpuload-cache", "gpuload-cache", "a node's local disk, here the test's folder"),
    ("range(90)", "range(1)", "one epoch of 20 photos shows what 90 would"),
    ("batch_size=256", "batch_size=4", "20 photos: batches of 256 with drop_last would be none"),
]
# torch.compile's graphs take minutes to build on a CPU: the examples run eagerly (compilation is
# tested in each transform's own tests)
ENVIRONMENT = {"TORCH_COMPILE_DISABLE": "1"}


def blocks(text: str) -> list[tuple[str, str]]:
    """The ``(language, code)`` of each fenced bash or python block of the "Using it" section."""
    section = text[re.search(r"^## Using it$", text, flags=re.MULTILINE).start() :]
    section = section[: re.search(r"^## (?!#)", section[1:], flags=re.MULTILINE).start() + 1]
    found = re.findall(r"^```(bash|python)\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert found, "the README's Using it section has no examples"
    return found


def scripts(text: str) -> list[tuple[str, str]]:
    """The blocks as a newcomer runs them: a python block without an import at its start goes on from
    the python block before it, in one script."""
    runs: list[tuple[str, str]] = []
    last_python = ""
    for language, code in blocks(text):
        for readme_text, here, _ in ADAPTED:
            code = code.replace(readme_text, here)
        if language == "python":
            first = next(line for line in code.splitlines() if line.strip())
            if not re.match(r"(import|from) ", first):
                code = last_python + "\n" + code
            last_python = code
        runs.append((language, code))
    return runs


def test_every_adaptation_is_still_in_the_readme():
    text = README.read_text()
    assert [readme_text for readme_text, _, _ in ADAPTED if readme_text not in text] == []


def test_a_block_that_goes_on_from_another_runs_after_it():
    text = "## Using it\n\n```python\nimport os\nx = 1\n```\n\n```python\nprint(x)\n```\n\n## Next\n"
    assert scripts(text) == [("python", "import os\nx = 1\n"), ("python", "import os\nx = 1\n\nprint(x)\n")]


def test_the_readme_examples_run_as_written(photo_folder, tmp_path, s3_server, monkeypatch):
    shutil.copytree(photo_folder, tmp_path / "photos")
    shutil.copytree(photo_folder, tmp_path / "val-q3")
    client = s3_server.client()
    client.create_bucket(Bucket="bucket")
    environment = {**os.environ, **fake_aws_environment(s3_server.endpoint), **ENVIRONMENT}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    for number, (language, code) in enumerate(scripts(README.read_text())):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"README example {number + 1} ({language}) failed:\n{code}\n{done.stderr[-3000:]}"
