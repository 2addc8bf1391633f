"""Shared fixtures: real JPEG folders made from matplotlib's grace_hopper.jpg, good and bad inputs."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from servers import FaultProxy, RangeHTTPServer, S3Server, fake_aws_environment

from gpuload import build_memmap, make_sample_folder
from gpuload.remote.store import Retry
from gpuload.sample import sample_photo
from slides.generate import TEMPLATE

SIZE = (48, 64)  # (height, width) of the small test photos


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    if os.environ.get("GPULOAD_REQUIRE_CUDA"):  # experiments/gpu_check.py: a skipped CUDA test would hide
        raise pytest.UsageError("GPULOAD_REQUIRE_CUDA is set and torch sees no CUDA GPU here")
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# The deletion check of the stream protocol (experiments/gpu_check.py, and a `cuda` test): with
# GPULOAD_DELETE_STEP naming one step of gpuload.loading.pipeline's protocol, that step does nothing
# in this test session, and the `cuda` tests that guard it must fail.
# Each step, and what it does once deleted: nothing.
PROTOCOL_STEPS = {
    "_host_waits": lambda *args: None,
    "_stream_waits": lambda *args: None,
    "_record_on": lambda *args: None,
    "_on_consumer_side": lambda *args: False,  # a CUDA-graph transform then runs in the producers
}


@pytest.fixture(autouse=True, scope="session")
def delete_a_protocol_step():
    step = os.environ.get("GPULOAD_DELETE_STEP")
    if not step:
        yield
        return
    if step not in PROTOCOL_STEPS:
        raise pytest.UsageError(f"GPULOAD_DELETE_STEP must be one of {', '.join(PROTOCOL_STEPS)}, got {step!r}")
    from gpuload.loading import pipeline

    real = getattr(pipeline, step)
    setattr(pipeline, step, PROTOCOL_STEPS[step])
    yield
    setattr(pipeline, step, real)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """A test leaves none of the threads our servers and readers start (a server's loop, its handlers,
    a RemoteFile's requests); the session's moto server and the libraries' own loops are not ours."""
    yield
    ours = ("(serve_forever)", "(process_request_thread)", "gpuload-remote", "gpuload-prefetch")
    deadline = time.monotonic() + 5
    while left := [t.name for t in threading.enumerate() if t.is_alive() and any(m in t.name for m in ours)]:
        if time.monotonic() > deadline:
            pytest.fail(f"threads left running: {left}")
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def restore_rng():
    """Tests may seed the global generators; give the next test the state it would have had."""
    torch_state, numpy_state, python_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


@pytest.fixture
def host_copies(monkeypatch) -> list[tuple[bool, bool]]:
    """Every ``Tensor.to`` of a CPU tensor from now on, as ``(pinned, non_blocking)``."""
    copies = []
    real = torch.Tensor.to

    def to(tensor, *args, **kwargs):
        if tensor.device.type == "cpu":
            copies.append((tensor.is_pinned(), kwargs.get("non_blocking", False)))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    return copies


@pytest.fixture(scope="session")
def photo_folder(tmp_path_factory) -> Path:
    """An ImageFolder of 5 classes x 4 distinct 48x64 JPEG photos. Do not modify it."""
    return make_sample_folder(tmp_path_factory.mktemp("photos") / "photos", images_per_class=4, size=SIZE)


@pytest.fixture(scope="session")
def built_dataset(photo_folder, tmp_path_factory) -> Path:
    """``photo_folder`` built into a memmap dataset. Do not modify it."""
    return build_memmap(photo_folder, tmp_path_factory.mktemp("built") / "photos.memmap", progress=False)


@pytest.fixture(scope="session")
def jpeg_dataset(photo_folder, tmp_path_factory) -> Path:
    """``photo_folder`` built into a jpeg dataset (its JPEGs stored as they are). Do not modify it."""
    return build_memmap(photo_folder, tmp_path_factory.mktemp("built") / "photos.jpeg", format="jpeg", progress=False)


TAGS = ("indoor", "portrait", "uniform")  # the multi-label classes of ``table_folder``


def photo_rows(folder: Path) -> list[dict]:
    """A metadata row per photo of ``folder`` (sorted): its ``file_name``, its class folder as ``label``,
    a float ``score``, an integer vector ``boxes`` of 4, a multi-label ``tags`` and a text ``caption``."""
    files = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*.jpg"))
    return [
        {
            "file_name": name,
            "label": name.split("/")[0],
            "score": position / 4,
            "boxes": [position, position + 1, position + 2, 2 * position],
            "tags": [TAGS[position % 3], *TAGS[:1]] if position % 2 else [TAGS[position % 3]],
            "caption": f"photo {position}: {name} é",
        }
        for position, name in enumerate(files)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def table_folder(photo_folder, tmp_path_factory) -> Path:
    """``photo_folder`` with a ``metadata.jsonl`` of :func:`photo_rows`. Do not modify it."""
    folder = Path(shutil.copytree(photo_folder, tmp_path_factory.mktemp("table") / "photos"))
    write_jsonl(folder / "metadata.jsonl", photo_rows(folder))
    return folder


@pytest.fixture(scope="session")
def fields_dataset(table_folder, tmp_path_factory) -> Path:
    """``table_folder`` built into a raw dataset with its fields. Do not modify it."""
    return build_memmap(table_folder, tmp_path_factory.mktemp("built") / "fields.memmap", progress=False)


@pytest.fixture
def photo_copy(photo_folder, tmp_path) -> Path:
    """A copy of ``photo_folder`` that a test may change."""
    return Path(shutil.copytree(photo_folder, tmp_path / "photos"))


def resident_kib(folder: Path, smaps: Path = Path("/proc/self/smaps")) -> dict[str, int]:
    """The KiB of each file under ``folder`` (by its path relative to it) that this process's mappings
    hold in memory, from Linux's /proc/self/smaps."""
    resident: dict[str, int] = {}
    name = None
    with open(smaps) as lines:
        for line in lines:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's header: address range ... [path]
                name = fields[5] if len(fields) >= 6 and Path(fields[5]).is_relative_to(folder) else None
            elif fields[0] == "Rss:" and name is not None:
                key = Path(name).relative_to(folder).as_posix()
                resident[key] = resident.get(key, 0) + int(fields[1])
    return resident


def photo(size: tuple[int, int] = SIZE) -> Image.Image:
    """grace_hopper.jpg scaled to ``size`` = (height, width), RGB."""
    with Image.open(sample_photo()) as image:
        return image.convert("RGB").resize((size[1], size[0]))


BAD_FILES = {
    "truncated.jpg": "truncated or corrupt",
    "truncated_eoi.jpg": "truncated or corrupt JPEG",  # cut, then the end marker: Pillow and ffmpeg accept it
    "corrupt.jpg": "truncated or corrupt JPEG",  # garbled entropy-coded data: Pillow and ffmpeg accept it
    "empty.jpg": "empty file",
    "notes.jpg": "not an image",
    "garbage.png": "not an image",
    "corrupt.png": "truncated or corrupt",  # garbled compressed pixels, no EXIF: Pillow kept half a picture
    # stray bytes between header segments: libjpeg skips them and warns, Pillow and ffmpeg say nothing
    "extraneous.jpg": "Corrupt JPEG data: 3 extraneous bytes before marker 0xdb",
    "corrupt_mpo.jpg": "truncated or corrupt JPEG",  # a multi-picture JPEG, its first picture garbled: Pillow shows it
}


def write_bad_file(folder: Path, name: str) -> Path:
    """Write one of ``BAD_FILES`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if name in ("truncated.jpg", "truncated_eoi.jpg", "corrupt.jpg", "corrupt_mpo.jpg"):
        if name == "corrupt_mpo.jpg":
            photo().save(path, "MPO", save_all=True, append_images=[photo()], quality=95)
        else:
            photo().save(path, quality=95)
        data = bytearray(path.read_bytes())
        if name.startswith("corrupt"):
            middle = (data.index(b"\xff\xd9") if name == "corrupt_mpo.jpg" else len(data)) // 2  # of the first picture
            for position in range(middle, middle + 40, 3):
                data[position] = 0x5A  # no 0xFF: the markers stay intact, the coded data is wrong
            path.write_bytes(bytes(data))
        else:
            path.write_bytes(bytes(data[: len(data) // 2]) + (b"\xff\xd9" if name == "truncated_eoi.jpg" else b""))
    elif name == "extraneous.jpg":
        photo().save(path, quality=95)
        data = path.read_bytes()
        tables = data.index(b"\xff\xdb")  # the first quantisation table
        path.write_bytes(data[:tables] + b"\x00\x12\x34" + data[tables:])
    elif name == "empty.jpg":
        path.touch()
    elif name == "notes.jpg":
        path.write_text("these are my notes, not a photo\n")
    elif name == "garbage.png":
        path.write_bytes(bytes(range(256)) * 8)
    elif name == "corrupt.png":
        photo().save(path)
        data = bytearray(path.read_bytes())
        start = data.index(b"IDAT") + 4  # the compressed pixels (Pillow does not check their CRC)
        length = int.from_bytes(data[start - 8 : start - 4], "big")
        data[start + length // 2 : start + length // 2 + 16] = bytes(16)
        path.write_bytes(bytes(data))
    return path


def write_odd_image(path: Path, kind: str, size: tuple[int, int] = SIZE) -> Image.Image:
    """Write a valid image of an unusual kind to ``path``; returns how it should look (RGB, upright)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    base = photo(size)
    if kind == "cmyk":
        base.convert("CMYK").save(path, quality=95)
        return Image.open(path).convert("RGB")
    if kind == "grayscale":
        base.convert("L").save(path, quality=95)
        return Image.open(path).convert("RGB")
    if kind == "palette":
        base.convert("P").save(path)
        return base.convert("P").convert("RGB")
    if kind == "rgba":
        rgba = base.convert("RGBA")
        rgba.putalpha(128)
        rgba.save(path)
        return base
    if kind == "sixteen_bit":
        gray = np.asarray(base.convert("L"), dtype=np.uint16) * 257  # full 16-bit range
        Image.fromarray(gray).save(path)
        return base.convert("L").convert("RGB")
    if kind == "mpo":
        # a multi-picture JPEG (a stereo pair, an Ultra HDR photo and its gain map): shown as its first picture
        other = photo((size[0] // 2, size[1] // 2)).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        base.save(path, "MPO", save_all=True, append_images=[other], quality=95)
        return Image.open(path).convert("RGB")
    if kind == "exif_rotated":
        # stored sideways (width and height swapped), with the EXIF tag that turns it upright
        stored = base.transpose(Image.Transpose.ROTATE_90)
        exif = Image.Exif()
        exif[0x0112] = 6  # "rotate 90 clockwise to display"
        stored.save(path, quality=98, exif=exif.tobytes())
        with Image.open(path) as reopened:
            return reopened.convert("RGB").transpose(Image.Transpose.ROTATE_270)
    raise ValueError(kind)


ODD_KINDS = {
    "cmyk": "cmyk.jpg",
    "grayscale": "gray.jpg",
    "palette": "palette.png",
    "rgba": "alpha.png",
    "sixteen_bit": "sixteen.png",
    "exif_rotated": "rotated.jpg",
    "mpo": "stereo.jpg",
}


NOT_FILES = {"fifo": "a named pipe", "socket": "a socket", "device": "a character device"}


@pytest.fixture
def make_not_a_file():
    """``make(path, kind)`` puts one of ``NOT_FILES`` at ``path`` (a device: a link to /dev/null).

    Opening a named pipe to read blocks until a writer comes. A watchdog comes as a writer whenever a
    reader has one of these pipes open, so code that opens one fails its test instead of hanging: it
    reads an empty file, and this fixture fails the test.
    """
    pipes: list[Path] = []
    opened: list[Path] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            for pipe in list(pipes):
                try:
                    os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO unless a reader has it open
                except OSError:
                    continue
                opened.append(pipe)

    def make(path: Path, kind: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
            pipes.append(path)
        elif kind == "socket":  # bound at a short path (108 bytes at most), then moved
            short = Path(tempfile.mkdtemp()) / "s"
            with socket.socket(socket.AF_UNIX) as bound:
                bound.bind(str(short))
            os.rename(short, path)
            short.parent.rmdir()
        else:
            os.symlink("/dev/null", path)
        return path

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    yield make
    stop.set()
    watcher.join()
    assert not opened, f"opened to read (it would have blocked until a writer came): {opened}"


@pytest.fixture
def bare_repo(tmp_path: Path) -> Path:
    """A copy of the repository's talk template and sources, with no results and no plots."""
    root = Path(__file__).resolve().parent.parent
    for folder in ("gpuload", "experiments", "tests"):
        shutil.copytree(root / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "data"))
    (tmp_path / "slides").mkdir()
    shutil.copy(root / TEMPLATE, tmp_path / TEMPLATE)
    (tmp_path / "assets" / "results").mkdir(parents=True)
    return tmp_path


# -- object storage: real servers on 127.0.0.1 (tests/servers.py) ---------------------------------------------
@dataclass
class S3Endpoint:
    """A fresh bucket on the session's moto server, reached through a fault proxy of its own."""

    server: S3Server
    proxy: FaultProxy
    bucket: str

    def url(self, path: str = "ds") -> str:
        return f"s3://{self.bucket}/{path}"

    def client(self):
        return self.server.client()


FAST_RETRY = Retry(attempts=3, base_delay=0.001, max_delay=0.01, timeout=2.0)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (each test takes a bucket of its own)."""
    pytest.importorskip("moto.server", reason="needs moto[server] (pip install -e '.[test]')")
    with S3Server() as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch) -> S3Endpoint:
    """A new bucket behind a :class:`FaultProxy`; AWS clients in this process point at the proxy with fake
    credentials and no EC2 metadata service, so nothing leaves the machine."""
    with FaultProxy(s3_server.endpoint, stall_seconds=5.0) as proxy:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in fake_aws_environment(proxy.url).items():
            monkeypatch.setenv(name, value)
        yield S3Endpoint(s3_server, proxy, s3_server.bucket())


@pytest.fixture
def http_root(tmp_path) -> Path:
    """The folder that the ``http`` fixture serves."""
    root = tmp_path / "www"
    root.mkdir()
    return root


@pytest.fixture
def http(http_root):
    """A Range HTTP server of ``http_root`` on 127.0.0.1, behind a :class:`FaultProxy` (use ``http.proxy.url``)."""
    with RangeHTTPServer(http_root) as server, FaultProxy(server.url) as proxy:
        server.proxy = proxy
        yield server


def shard_of(folder: Path, path: Path, bad: str | None = None, masks: int | None = None) -> Path:
    """The photos of ``folder`` as one uncompressed WebDataset tar (``jpg`` and its class folder as
    ``cls``), written by Python's tarfile; ``bad``: one of ``BAD_FILES`` as one more sample's image;
    ``masks``: a ``png`` mask beside each image, of class ids ``masks`` + the sample's position (the
    photos' size, 48x64)."""
    samples = [(photo.read_bytes(), photo.parent.name) for photo in sorted(folder.rglob("*.jpg"))]
    if bad is not None:
        write_bad_file(path.parent, bad)
        samples.insert(3, ((path.parent / bad).read_bytes(), samples[0][1]))
    with tarfile.open(path, "w") as tar:
        for position, (data, label) in enumerate(samples):
            members = [("jpg", data), ("cls", label.encode())]
            if masks is not None:
                Image.fromarray(np.full((48, 64), masks + position, np.uint8)).save(ids := io.BytesIO(), "PNG")
                members.append(("png", ids.getvalue()))
            for extension, member in members:
                info = tarfile.TarInfo(f"{position:06d}.{extension}")
                info.size = len(member)
                tar.addfile(info, io.BytesIO(member))
    return path


def write_parquet(path: Path, sources: list[Path], classes: list[str], **extra) -> Path:
    """``sources`` as Hugging Face's export: ``image`` ``{bytes, path}``, ``label`` a class index whose names
    the ``huggingface`` schema metadata records, and ``extra`` columns (lists of values)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "image": [{"bytes": source.read_bytes(), "path": source.name} for source in sources],
            "label": pa.array([classes.index(source.parent.name) for source in sources], pa.int64()),
            **extra,
        }
    )
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path, row_group_size=7)
    return path


def open_files() -> list[str]:
    """What this process's descriptors are open on."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed since
            pass
    return found
