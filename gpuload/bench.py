"""``gpuload bench``: loading throughput of gpuload against the stock ways and the machine's limit, in one run."""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
from tqdm.auto import tqdm

from .errors import UsageError
from .format.dataset import MemmapImageDataset, decode_jpeg_bytes, storage_order
from .loading.collate import Collate
from .loading.crop import RandomResizedCropDecode
from .loading.device import resolve_device
from .loading.loader import DataLoader
from .machine import default_workers, describe_machine, machine_line
from .text import count, image_size
from .transforms.augment import RandomResizedCrop
from .writing.decode import decode_image

__all__ = ["BENCH_LABELS", "SHORT_EPOCH", "bench_rows", "format_bench", "gather_limit", "run_bench", "short_epochs"]

SHORT_EPOCH = 1.0  # seconds: a timed epoch shorter than this measures start-up as much as loading

BENCH_LABELS = {
    "limit_gather": "limit: index_select memmap -> buffer, all threads",
    "limit_gather_split": "limit: index_select, one share per thread",
    "limit_h2d": "limit: pinned host-to-device copy",
    "gpuload": "gpuload.DataLoader",
    "collate": "torch DataLoader + gpuload.Collate",
    "image_folder": "torch DataLoader + ImageFolder (JPEGs)",
    "gpuload_augment": "gpuload.DataLoader, RandomResizedCrop after the copy",
    "gpuload_crop": "gpuload.DataLoader, crop in the loader's threads",
    "image_folder_augment": "ImageFolder + decode_jpeg + v2 RandomResizedCrop, workers",
    "stored_jpegs_augment": "stored JPEGs + decode_jpeg + v2 RandomResizedCrop, workers",
    "limit_decode": "reference: libjpeg-turbo whole decode, all threads",
    "gpuload_decode": "gpuload.DataLoader, RandomResizedCropDecode (fast DCT)",
    "gpuload_decode_exact": "gpuload.DataLoader, RandomResizedCropDecode (accurate DCT)",
    "gpuload_decode_gpu": "gpuload.DataLoader, RandomResizedCropDecode(gpu=True): nvJPEG",
}


def run_bench(
    path: str | os.PathLike,
    *,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    epochs: int = 3,
    max_batches: int | None = None,
    augment: int | None = None,
    progress: bool = True,
) -> dict:
    """Measure shuffled-batch loading from the dataset at ``path``; returns the results as a dict.

    Contenders, on the same dataset and batch size, shuffled, page cache warmed by an untimed
    first epoch, each timed over ``epochs`` epochs of one loader, as a training loop runs them
    (median, min and max). Every contender's epoch is the same: the whole batches of the dataset's
    images, or, with ``max_batches`` (for a dataset the stock loaders take too long to read), those
    of its first ``max_batches * batch_size`` images; the report's ``timed_images`` is that count.

    - ``limit_gather`` and ``limit_gather_split``: the machine's limit, the better of two
      parallel gathers from the memmap into a reused host buffer (see :class:`_GatherLimit`);
    - ``limit_h2d`` (CUDA only): pinned host-to-device copies of one batch-sized buffer;
    - ``gpuload``: :class:`gpuload.DataLoader` to ``device``;
    - ``collate``: the stock ``torch.utils.data.DataLoader`` with :class:`gpuload.Collate`;
    - ``image_folder``: ``ImageFolder`` + stock ``DataLoader`` decoding the source JPEGs on all
      cores, when the sources are still there, with persistent workers, as a training loop keeps them.

    With ``augment`` (an output side, e.g. 224), the same with a per-sample random resized crop to
    ``augment`` and a flip: ``gpuload_crop`` (``decode=RandomResizedCropDecode(augment)``: the loader's
    threads crop each image from the memmap), ``gpuload_augment`` (:class:`gpuload.RandomResizedCrop`
    as the loader's ``transform``, on ``device`` after the copy of whole images) and
    ``image_folder_augment`` (the sources decoded by torchvision's ``decode_jpeg``, v2 transforms per
    sample in the stock loader's worker processes, ``pin_memory`` on CUDA: what a user would pick instead).

    A jpeg dataset is cropped at decode time: ``gpuload_decode`` (:class:`gpuload.DataLoader` with
    ``decode=RandomResizedCropDecode(augment or 224)``, libjpeg-turbo's fast DCT) and
    ``gpuload_decode_exact`` (accurate DCT, as the stock loader decodes) against
    ``image_folder_augment`` and ``limit_decode``, libjpeg-turbo decoding every stored JPEG whole on all cores.
    Where the build re-encoded images (``--max-side``, progressive sources...), the sources are not
    the JPEGs that gpuload decodes: the stock loader then decodes the stored JPEGs instead
    (``stored_jpegs_augment``), like for like; the report's ``stock_loader_reads`` says which.

    A contender that raises (while it is made or while it runs) does not stop the others: the report's
    ``failed`` maps its name to its error in one line, and ``results`` holds the contenders measured.
    ``gpuload bench`` prints the failures in its table and on stderr, and exits with 1 when one of
    gpuload's own contenders (``gpuload*``) failed, 0 when only a stock loader or a limit did.
    """
    checked = {"batch_size": batch_size, "epochs": epochs}
    if max_batches is not None:
        checked["max_batches"] = max_batches
    for name, value in checked.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name} must be a positive integer, got {value!r}")
    if augment is not None and (not isinstance(augment, int) or isinstance(augment, bool) or augment < 1):
        raise UsageError(f"augment must be a positive output side, got {augment!r}")
    dataset = MemmapImageDataset(path)
    device = resolve_device(device)
    if len(dataset) < batch_size:
        raise UsageError(f"the dataset has {count(len(dataset), 'image')}, fewer than one batch of {batch_size}")
    batches = len(dataset) // batch_size
    timed = min(batches, max_batches or batches) * batch_size  # images of every contender's epoch
    epoch = _Epoch(len(dataset), None if timed == batches * batch_size else range(timed), timed)
    if dataset.image_shape is None:  # jpeg: batches of crops
        augment = augment or 224
        image_shape = (3, augment, augment)
        contenders: dict[str, Callable[[], Callable[[], int]]] = {"limit_decode": partial(_DecodeLimit, dataset, epoch)}
        decodes = {"gpuload_decode": {"fast": True}, "gpuload_decode_exact": {"fast": False}}
        if device.type == "cuda" and _gpu_decode_loads(device):
            decodes["gpuload_decode_gpu"] = {"gpu": True}
        for name, options in decodes.items():
            contenders[name] = partial(
                _loader, dataset, batch_size, epoch, device, decode=partial(RandomResizedCropDecode, augment, **options)
            )
    else:
        image_shape = tuple(dataset.image_shape)
        contenders = _raw_contenders(dataset, batch_size, epoch, device, augment)
    image_bytes = math.prod(image_shape)
    crop_bytes = 3 * augment * augment if augment is not None else image_bytes  # what a cropping contender serves
    sources = [Path(source) for source, _ in dataset.samples]
    # A jpeg build that re-encoded images (--max-side...) stores other JPEGs than its sources.
    stored = dataset.image_shape is None and bool(dataset.manifest.jpeg["reencoded"])
    if stored:
        contenders["stored_jpegs_augment"] = partial(
            _Folder, dataset, batch_size, epoch, device, augment=augment, stored=True
        )
    if all(source.is_file() for source in sources[:: max(1, len(sources) // 16)]):
        if dataset.image_shape is not None:
            contenders["image_folder"] = partial(_Folder, dataset, batch_size, epoch, device)
        if augment is not None and not stored:
            contenders["image_folder_augment"] = partial(_Folder, dataset, batch_size, epoch, device, augment=augment)
    else:
        sources = []

    results, failed = {}, {}
    with tqdm(total=len(contenders) * (epochs + 1), desc="bench", unit="pass", disable=not progress) as bar:
        for name, make in contenders.items():
            bar.set_postfix_str(name)
            run, runs, passes = None, [], 0
            try:
                run = make()
                # the first pass warms up: page cache, pinned buffers, CUDA context, thread pools, workers
                for passes in range(1, epochs + 2):
                    seconds, images = _timed(run, device)
                    runs += [images / seconds] if passes > 1 else []
                    bar.update()
            except Exception as error:  # one contender's failure is reported; the others still run
                failed[name] = _one_line(error)
                bar.update(epochs + 2 - passes)  # the passes left, the failed one included
                continue
            finally:
                run = None  # the stock loader's persistent workers stop here
                gc.collect()
            served = crop_bytes if name.endswith(("_augment", "_crop")) else image_bytes
            results[name] = {
                "images_per_second": statistics.median(runs),
                "min": min(runs),
                "max": max(runs),
                "runs": runs,
                "gigabytes_per_second": statistics.median(runs) * served / 1e9,
            }
    return {
        "dataset": str(dataset.path),
        "format": "raw" if dataset.image_shape is not None else "jpeg",
        "images": len(dataset),
        "image_shape": list(image_shape),
        "batch_size": batch_size,
        "batches_per_epoch": batches,
        "max_batches": max_batches,
        "timed_images": timed,
        "device": str(device),
        "sources_present": bool(sources),
        "stock_loader_reads": "the stored JPEGs" if stored else "the sources",
        "reencoded": dataset.manifest.jpeg.get("reencoded", {}),
        "machine": describe_machine(),
        "machine_line": machine_line(),
        "results": results,
        "failed": failed,
    }


def _one_line(error: BaseException) -> str:
    """``"RuntimeError: its message's first line"``."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


class _Epoch:
    """What every contender's epoch reads: ``timed`` images in whole batches, shuffled anew each epoch,
    from the whole dataset (``subset`` None: the stock semantics, a partial last batch dropped) or
    from the images of ``subset`` (exactly ``timed`` of them)."""

    def __init__(self, length: int, subset: range | None, timed: int) -> None:
        self.length, self.subset, self.timed = length, subset, timed

    def order(self) -> torch.Tensor:
        """One epoch's shuffled indices, ``timed`` of them."""
        if self.subset is None:
            return torch.randperm(self.length)[: self.timed]
        return torch.as_tensor(self.subset)[torch.randperm(len(self.subset))]

    def loader_options(self) -> dict:
        """``shuffle`` and ``sampler`` of a ``DataLoader`` (gpuload's or torch's) serving this epoch."""
        if self.subset is None:
            return {"shuffle": True}
        return {"shuffle": False, "sampler": torch.utils.data.SubsetRandomSampler(self.subset)}


def _loader(
    dataset: MemmapImageDataset, batch_size: int, epoch: _Epoch, device: torch.device, **options
) -> Callable[[], int]:
    """An epoch of :class:`gpuload.DataLoader`; a ``decode`` option is a factory, called here."""
    if "decode" in options:
        options["decode"] = options["decode"]()
    loader = DataLoader(dataset, batch_size, drop_last=True, device=device, **epoch.loader_options(), **options)
    return partial(_drain, loader)


def _raw_contenders(
    dataset: MemmapImageDataset, batch_size: int, epoch: _Epoch, device: torch.device, augment: int | None
) -> dict[str, Callable[[], Callable[[], int]]]:
    """Each contender on a raw dataset, as a function that makes it (a call runs one epoch)."""

    def collate() -> Callable[[], int]:
        loader = torch.utils.data.DataLoader(
            dataset, batch_size, drop_last=True, collate_fn=Collate(device), **epoch.loader_options()
        )
        return partial(_drain, loader)

    contenders: dict[str, Callable[[], Callable[[], int]]] = {
        "limit_gather": partial(_GatherLimit, dataset, batch_size, epoch, split=False),
        "limit_gather_split": partial(_GatherLimit, dataset, batch_size, epoch, split=True),
        "gpuload": partial(_loader, dataset, batch_size, epoch, device),
        "collate": collate,
    }
    if device.type == "cuda":
        contenders["limit_h2d"] = lambda: partial(_h2d_limit, dataset, batch_size, epoch.timed // batch_size, device)
    if augment is not None:
        contenders["gpuload_crop"] = partial(
            _loader, dataset, batch_size, epoch, device, decode=partial(RandomResizedCropDecode, augment)
        )
        contenders["gpuload_augment"] = partial(
            _loader, dataset, batch_size, epoch, device, transform=RandomResizedCrop(augment, flip=True)
        )
    return contenders


def _gpu_decode_loads(device: torch.device) -> bool:
    """Whether ``gpu=True`` decoding (TorchCodec's nvJPEG) loads here; said on stderr when not."""
    from .loading.device import check_gpu_decode

    try:
        check_gpu_decode(device)
    except UsageError as error:
        print(f"gpuload bench: the nvJPEG contender is left out: {error}", file=sys.stderr)
        return False
    return True


def gather_limit(report: dict) -> float | None:
    """The machine's limit of a :func:`run_bench` report: the better of the two parallel gathers
    (raw), or the whole decode (jpeg); ``None`` where none was measured (it failed)."""
    return max(
        (
            result["images_per_second"]
            for name, result in report["results"].items()
            if name.startswith(("limit_gather", "limit_decode"))
        ),
        default=None,
    )


def bench_rows(report: dict) -> list[dict]:
    """Each contender of a :func:`run_bench` report: its name, label, rate, GB/s, share of the machine's
    limit (``None`` but for contenders serving whole raw images, and where the limit failed) and speed-up
    over the stock loader doing the same work (``None`` where there is none or it failed); then each
    contender that failed, with its ``error`` and ``None`` for its numbers."""
    limit = gather_limit(report)
    rates = {name: result["images_per_second"] for name, result in report["results"].items()}
    rows = []
    for name, result in report["results"].items():
        rate = result["images_per_second"]
        stock = next((other for other in _STOCK.get(name, ()) if other in rates), None)
        whole = name in _WHOLE and report.get("format") != "jpeg" and limit is not None
        rows.append(
            {
                "name": name,
                "label": BENCH_LABELS[name],
                "images_per_second": rate,
                "gigabytes_per_second": result["gigabytes_per_second"],
                "of_limit": rate / limit if whole else None,
                "x_stock": rate / rates[stock] if stock is not None and stock != name else None,
                "error": None,
            }
        )
    for name, error in report.get("failed", {}).items():  # reports older than failures have no "failed"
        rows.append(
            {
                "name": name,
                "label": BENCH_LABELS[name],
                "images_per_second": None,
                "gigabytes_per_second": None,
                "of_limit": None,
                "x_stock": None,
                "error": error,
            }
        )
    return rows


def format_bench(report: dict) -> str:
    """The report of :func:`run_bench` as a table: each contender's rate, its share of the machine's
    limit (contenders serving whole images) and its speed-up over the stock loader doing the same work."""
    _, height, width = report["image_shape"]
    timed = report.get("timed_images")  # reports older than the field timed the stock loaders on fewer images
    what = "jpeg images decoded to crops of" if report.get("format") == "jpeg" else "images of"
    lines = [
        f"gpuload bench on {report['machine_line']}",
        f"{count(report['images'], 'image') if what == 'images of' else report['images']} "
        f"{what.removeprefix('images ')} {image_size(height, width)} uint8 RGB, batch {report['batch_size']}, "
        f"shuffled, device {report['device']}, page cache warm"
        + (f", epochs of {count(timed, 'image')}" if timed is not None else ""),
        f"{'contender':<58} {'images/s':>10} {'min-max of the epochs':>22} {'GB/s':>7} {'of limit':>9} {'x stock':>8}",
    ]
    results = report["results"]
    for row in bench_rows(report):
        if row["error"] is not None:
            lines.append(f"{row['label']:<58} failed: {row['error']}")
            continue
        share = "" if row["of_limit"] is None else f"{row['of_limit']:.0%}"
        speedup = "" if row["x_stock"] is None else f"{row['x_stock']:.2f}x"
        spread = f"{results[row['name']]['min']:,.0f}-{results[row['name']]['max']:,.0f}"
        lines.append(
            f"{row['label']:<58} {row['images_per_second']:>10,.0f} {spread:>22} {row['gigabytes_per_second']:>7.2f} "
            f"{share:>9} {speedup:>8}"
        )
    if "limit_h2d" in report["results"] and "gpuload" in report["results"]:
        h2d = report["results"]["limit_h2d"]["images_per_second"]
        lines.append(
            f"gpuload.DataLoader reaches {report['results']['gpuload']['images_per_second'] / h2d:.0%} of the host-to-device limit"
        )
    if report.get("stock_loader_reads") == "the stored JPEGs":
        reencoded = ", ".join(f"{count} {reason}" for reason, count in report["reencoded"].items())
        lines.append(
            f"(the stock loader decodes the stored JPEGs, as gpuload does, not the sources: the build re-encoded "
            f"images ({reencoded}))"
        )
    elif not report["sources_present"]:
        lines.append("(ImageFolder skipped: the source JPEGs are not there any more)")
    return "\n".join(lines)


def short_epochs(report: dict) -> str | None:
    """A warning where a :func:`run_bench` report's timed epochs lasted less than :data:`SHORT_EPOCH`:
    starting threads and worker processes then weighs in each rate, which a longer epoch hides (one run
    on 128 images read a limit of 295 images/s below a loader's 4,992); else ``None``.

    Example:
        >>> report = {"timed_images": 128, "results": {"gpuload": {"min": 3900.0, "max": 5100.0}}}
        >>> short_epochs(report).split(":")[0]
        'the timed epochs of 128 images lasted 0.025 to 0.033 s'
    """
    timed = report.get("timed_images")
    rates = [result["max"] for result in report["results"].values()]
    if not timed or not rates or timed / max(rates) >= SHORT_EPOCH:
        return None
    longest = max(timed / result["min"] for result in report["results"].values())
    shortest = timed / max(rates)
    return (
        f"the timed epochs of {count(timed, 'image')} lasted {shortest:.2g} to {longest:.2g} s: too short "
        f"for steady rates (starting threads and workers weighs in; a limit can read below the loader): read them as "
        f"rough, compare the min-max columns, or bench a dataset of about {math.ceil(max(rates) * SHORT_EPOCH):,} "
        "images or more (or a larger --max-batches)"
    )


# Contenders serving whole images (their share of the gather limit means something), and the stock
# loader doing the same work as each (same images, same crop and flip).
_WHOLE = {"limit_gather", "limit_gather_split", "limit_h2d", "gpuload", "collate", "image_folder"}
_STOCK = {
    "gpuload": ("image_folder",),
    "collate": ("image_folder",),
    "gpuload_crop": ("image_folder_augment",),
    "gpuload_augment": ("image_folder_augment",),
    "gpuload_decode": ("image_folder_augment", "stored_jpegs_augment"),
    "gpuload_decode_exact": ("image_folder_augment", "stored_jpegs_augment"),
    "gpuload_decode_gpu": ("image_folder_augment", "stored_jpegs_augment"),
}


def _timed(run: Callable[[], int], device: torch.device) -> tuple[float, int]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    images = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started, images


def _drain(loader: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> int:
    images = 0
    for batch, _ in loader:
        images += len(batch)
    return images


class _DecodeLimit:
    """The stored JPEGs of an epoch (:class:`_Epoch`) of a jpeg dataset decoded whole by libjpeg-turbo,
    one thread per core, into reused buffers, in a shuffled order: what decoding alone costs."""

    def __init__(self, dataset: MemmapImageDataset, epoch: _Epoch) -> None:
        self.dataset, self.epoch, self.workers = dataset, epoch, default_workers()
        height, width = dataset.data.shapes.max(0).values.tolist()
        self.buffers = [np.empty(height * width * 3, dtype=np.uint8) for _ in range(self.workers)]

    def __call__(self) -> int:
        order = self.epoch.order()
        with ThreadPoolExecutor(self.workers) as pool:
            list(pool.map(self._decode, order.chunk(self.workers), self.buffers))
        return len(order)

    def _decode(self, indices: torch.Tensor, buffer: np.ndarray) -> None:
        for index in indices.tolist():
            decode_jpeg_bytes(self.dataset.read_jpeg(index), partial(self.dataset.describe, index), buffer=buffer)


class _GatherLimit:
    """One shuffled epoch (:class:`_Epoch`) gathered from the memmap into a reused buffer, nothing else.

    ``split=False``: one ``index_select`` per batch on all of torch's threads; ``split=True``:
    the batch cut into one share per core, each gathered by its own thread.
    """

    def __init__(self, dataset: MemmapImageDataset, batch_size: int, epoch: _Epoch, *, split: bool) -> None:
        self.source = storage_order(dataset.data.images)[0]  # the file's order, as the loader gathers
        self.buffer = torch.empty((batch_size, *self.source.shape[1:]), dtype=self.source.dtype)
        self.batch_size, self.epoch, self.split, self.workers = batch_size, epoch, split, default_workers()

    def __call__(self) -> int:
        batches = self.epoch.order().split(self.batch_size)  # whole batches: the epoch has timed images
        if not self.split:
            for indices in batches:
                torch.index_select(self.source, 0, indices, out=self.buffer)
            return len(batches) * self.batch_size
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(self.workers) as pool:
                for indices in batches:
                    shares = zip(indices.chunk(self.workers), self.buffer.chunk(self.workers))
                    list(pool.map(lambda share: torch.index_select(self.source, 0, share[0], out=share[1]), shares))
        finally:
            torch.set_num_threads(threads)
        return len(batches) * self.batch_size


def _h2d_limit(dataset: MemmapImageDataset, batch_size: int, batches: int, device: torch.device) -> int:
    """``batches`` copies of one pinned batch-sized buffer to the device, back to back (an epoch's)."""
    host = torch.empty((batch_size, *dataset.image_shape), dtype=torch.uint8, pin_memory=True)
    target = torch.empty_like(host, device=device)
    for _ in range(batches):
        target.copy_(host, non_blocking=True)
    return batches * batch_size


class _Folder:
    """ImageFolder over the sources of the dataset's images, in the dataset's order (an index is the same
    image as in the dataset), in the stock loader's worker processes (all cores, persistent, ``pin_memory``
    on CUDA), batches copied to ``device``: decoded to the dataset's size, or, with ``augment``, randomly
    cropped to ``augment`` and flipped, per sample. ``stored``: a jpeg dataset's stored JPEGs instead of the
    sources (:class:`_StoredJpegs`). A call is one whole shuffled epoch (:class:`_Epoch`; nothing is left
    in flight for the next)."""

    def __init__(
        self,
        dataset: MemmapImageDataset,
        batch_size: int,
        epoch: _Epoch,
        device: torch.device,
        augment: int | None = None,
        stored: bool = False,
    ) -> None:
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import v2

        if augment is None:
            folder = ImageFolder(
                dataset.manifest.source, loader=_SourceDecoder(tuple(dataset.image_shape[1:]), dataset.manifest.resize)
            )
        else:
            transform = v2.Compose([v2.RandomResizedCrop(augment, antialias=True), v2.RandomHorizontalFlip()])
            if stored:
                folder = _StoredJpegs(dataset, transform)
            else:
                folder = ImageFolder(dataset.manifest.source, loader=_TorchvisionDecoder(), transform=transform)
        if not stored:  # the images the build kept (not those it skipped), in its order
            folder.samples = folder.imgs = dataset.samples
        self.device = device
        self.loader = torch.utils.data.DataLoader(
            folder,
            batch_size,
            drop_last=True,
            num_workers=default_workers(),
            pin_memory=device.type == "cuda",
            persistent_workers=True,
            **epoch.loader_options(),
        )

    def __call__(self) -> int:
        return _drain((batch.to(self.device, non_blocking=True), labels) for batch, labels in self.loader)


class _StoredJpegs(torch.utils.data.Dataset):
    """The stored JPEGs of a jpeg dataset as the stock loader would read them: each image's bytes,
    decoded by :class:`_TorchvisionDecoder` and transformed, with its label."""

    def __init__(self, dataset: MemmapImageDataset, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data = torch.frombuffer(bytearray(self.dataset.read_jpeg(index)), dtype=torch.uint8)
        return self.transform(_TorchvisionDecoder()(data)), int(self.dataset.data.labels[index])


class _TorchvisionDecoder:
    """ImageFolder's ``loader`` for the stock contender: torchvision's own decoder (``decode_jpeg`` for a
    JPEG, libjpeg-turbo like gpuload's; the fastest stock way), RGB, EXIF orientation applied; of a
    file, or of its bytes."""

    def __call__(self, path: str | torch.Tensor) -> torch.Tensor:
        import warnings

        from torchvision.io import ImageReadMode, decode_image

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision 0.29 deprecates its decoders for TorchCodec's
            return decode_image(path, mode=ImageReadMode.RGB, apply_exif_orientation=True)


class _SourceDecoder:
    """ImageFolder's ``loader``: a picklable call to :func:`gpuload.decode_image`."""

    def __init__(self, size: tuple[int, int], resize: str) -> None:
        self.size, self.resize = size, resize

    def __call__(self, path: str) -> torch.Tensor:
        return decode_image(path, self.size, self.resize)
