"""A ``torch.utils.data.ConcatDataset`` of gpuload datasets, read by one :class:`gpuload.DataLoader`.

Its parts (nested ConcatDatasets and Subsets flattened) become two int tensors, each image's part
and its index in that part, and one of labels: 20 bytes an image, nothing per image in Python. The
loader orders, shards, resumes and shuffles the concatenation's indices as one dataset's; a batch's
rows of each part are read by that part's own gather (whole raw images, a crop, a JPEG decode) and
copied into the batch's buffer, its fields likewise. The parts must make one batch: without a
``decode=`` crop, raw images of one size; the same fields; and class lists that agree wherever two
parts share a label (one list the start of the other): anything else is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..errors import UsageError
from ..format.dataset import ImageData, MemmapImageDataset
from .crop import CenterCropDecode, RandomResizedCropDecode
from .fields import FieldGather
from .gathers import stored_pixels
from .order import image_blocks
from .pipeline import Gather
from .subsets import check_positions, subset_indices

__all__ = ["ConcatFields", "ConcatGather", "ConcatImages"]

Part = MemmapImageDataset | ImageData


class ConcatImages:
    """A ConcatDataset's images as the loader reads them, its parts checked against each other.

    Args:
        dataset: a ``ConcatDataset`` of :class:`MemmapImageDataset` (raw or jpeg, local or at a URL),
            :class:`ImageData`, ``Subset`` and ``ConcatDataset`` of them.
        decode: the loader's ``decode=`` crop, or ``None`` (then every part holds raw images of one size).

    Attributes:
        parts: the gpuload datasets, in the concatenation's order (a dataset used twice appears twice).
        part: int32 ``[N]``, the part of each image; ``local``: int64 ``[N]``, its index in that part.
        labels: int64 ``[N]``. ``fields``: the :class:`ConcatFields` of the batches.
        image_shape: ``(3, H, W)`` of the parts' images (without ``decode``).
        channels_last: whether batches are channels-last in memory (channel-first only when every part is).
        layouts: whether each part's gather writes channels-last (a crop does; a raw part as it is stored).

    Raises:
        TypeError: a part that is no gpuload dataset. UsageError: parts that cannot make one batch.

    Example:
        >>> def data(n): return ImageData(images=torch.zeros(n, 3, 2, 2, dtype=torch.uint8), labels=torch.arange(n), batch_size=[n])
        >>> images = ConcatImages(torch.utils.data.ConcatDataset([data(2), torch.utils.data.Subset(data(3), [2])]), None)
        >>> images.part.tolist(), images.local.tolist(), images.labels.tolist()
        ([0, 0, 1], [0, 1, 2], [0, 1, 2])
    """

    def __init__(
        self, dataset: torch.utils.data.ConcatDataset, decode: RandomResizedCropDecode | CenterCropDecode | None
    ) -> None:
        self.parts, self.part, self.local = _flatten(dataset)
        _check_parts(self.parts, decode)
        self.labels = torch.empty(len(self.part), dtype=torch.int64)
        for number, rows, local in self.split(torch.arange(len(self.part))):
            self.labels[rows] = _labels(self.parts[number])[local]
        layouts = [stored_pixels(part)[1] for part in self.parts]
        self.layouts = [decode is not None or layout for layout in layouts]  # what each part's gather writes
        self.channels_last = decode is not None or any(layouts)
        self.image_shape = None if decode is not None else _image_shape(self.parts[0])
        self.fields = ConcatFields(self)

    def image_blocks(self) -> torch.Tensor:
        """int64 ``[N]``: the block each image starts in (:func:`~gpuload.loading.order.image_blocks` of its part),
        each part's blocks numbered after the previous part's: a block-aware order of the concatenation."""
        blocks, first = torch.empty(len(self.part), dtype=torch.int64), 0
        for number, part in enumerate(self.parts):
            part_blocks = image_blocks(part)
            rows = torch.nonzero(self.part == number).squeeze(1)
            blocks[rows] = part_blocks[self.local[rows]] + first
            first += int(part_blocks.max()) + 1 if len(part_blocks) else 0
        return blocks

    def split(self, indices: torch.Tensor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """For each part that ``indices`` (of the concatenation) reach: ``(part, rows, local)``, the rows of
        ``indices`` in it and their indices in that part."""
        parts, local = self.part[indices], self.local[indices]
        for number in torch.unique(parts).tolist():
            rows = torch.nonzero(parts == number).squeeze(1)
            yield number, rows, local[rows]


class ConcatGather:
    """A batch of a concatenation: each part's rows read by ``gathers[part]`` (``gather(local, out)``, a crop's
    with ``keys=``, the concatenation's indices: its parts draw apart) into a buffer in that part's layout (its
    bytes as they lie) and copied into the batch's rows; a batch of one part is read into the batch directly.

    Example:
        >>> def data(n, value): return ImageData(images=torch.full((n, 3, 1, 1), value, dtype=torch.uint8), labels=torch.zeros(n, dtype=torch.int64), batch_size=[n])
        >>> images = ConcatImages(torch.utils.data.ConcatDataset([data(1, 7), data(2, 9)]), None)
        >>> from gpuload.loading.gathers import dataset_gather
        >>> gathers = [dataset_gather(part, None, seed=0, epoch=0, device=torch.device("cpu")) for part in images.parts]
        >>> out = torch.empty(3, 3, 1, 1, dtype=torch.uint8)
        >>> ConcatGather(images, gathers, keyed=False)(torch.tensor([1, 0, 2]), out)
        >>> out[:, 0].flatten().tolist()
        [9, 7, 9]
    """

    def __init__(self, images: ConcatImages, gathers: list[Gather], *, keyed: bool) -> None:
        self.images, self.gathers, self.keyed = images, gathers, keyed

    def __call__(self, indices: torch.Tensor, out: torch.Tensor) -> None:
        for number, rows, local in self.images.split(indices):
            keys = {"keys": indices[rows]} if self.keyed else {}
            if len(rows) == len(indices):
                self.gathers[number](local, out, **keys)
                continue
            memory_format = torch.channels_last if self.images.layouts[number] else torch.contiguous_format
            scratch = torch.empty((len(rows), *out.shape[1:]), dtype=out.dtype, memory_format=memory_format)
            self.gathers[number](local, scratch, **keys)
            out.index_copy_(0, rows, scratch)


class ConcatFields(FieldGather):
    """The fields of a concatenation's batches (every part has the same): each part's rows gathered by
    that part's :class:`FieldGather` and copied into the batch's buffers, text into its rows' places.

    Example:
        >>> data = ImageData(images=torch.zeros(2, 3, 1, 1, dtype=torch.uint8), labels=torch.zeros(2, dtype=torch.int64), batch_size=[2])
        >>> bool(ConcatFields(ConcatImages(torch.utils.data.ConcatDataset([data, data]), None)))
        False
    """

    def __init__(self, images: ConcatImages) -> None:
        self.images = images
        self.part_fields = [FieldGather(_fields(part)) for part in images.parts]
        super().__init__(_fields(images.parts[0]))

    def fill(self, indices: torch.Tensor, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | list[str]]:
        texts: dict[str, list[str]] = {name: [""] * len(indices) for name in self.columns if name not in out}
        for number, rows, local in self.images.split(indices):
            scratch = {name: torch.empty((len(rows), *row), dtype=dtype) for name, (row, dtype) in self.buffers.items()}
            for name, value in self.part_fields[number].fill(local, scratch).items():
                if isinstance(value, torch.Tensor):
                    out[name].index_copy_(0, rows, value)
                else:
                    for row, text in zip(rows.tolist(), value):
                        texts[name][row] = text
        return {name: out[name] if name in out else texts[name] for name in self.columns}


def _flatten(dataset: object) -> tuple[list[Part], torch.Tensor, torch.Tensor]:
    """``(parts, part, local)`` of a dataset: a ConcatDataset's parts one after the other, a Subset's
    images picked from its dataset's (negative indices count from the end, as torch's Subset indexes)."""
    if isinstance(dataset, torch.utils.data.ConcatDataset):
        parts, part, local = [], [], []
        for inner in dataset.datasets:
            inner_parts, inner_part, inner_local = _flatten(inner)
            part.append(inner_part + len(parts))
            local.append(inner_local)
            parts += inner_parts
        return parts, torch.cat(part), torch.cat(local)
    if isinstance(dataset, torch.utils.data.Subset):
        parts, part, local = _flatten(dataset.dataset)
        indices = check_positions(subset_indices(dataset), len(part), "a Subset in the ConcatDataset")
        return parts, part[indices], local[indices]
    if isinstance(dataset, (MemmapImageDataset, ImageData)):
        return [dataset], torch.zeros(len(dataset), dtype=torch.int32), torch.arange(len(dataset))
    raise TypeError(
        "DataLoader reads a ConcatDataset of MemmapImageDatasets and ImageDatas (or Subsets and ConcatDatasets of "
        f"them), got a part of {type(dataset).__name__}: build it with gpuload build-memmap, or use torch's DataLoader"
    )


def _check_parts(parts: list[Part], decode: RandomResizedCropDecode | CenterCropDecode | None) -> None:
    """The parts make one batch (see the module's docstring), or one line says which part does not."""
    if decode is not None and decode.gpu:
        raise UsageError(
            "gpu=True decodes one dataset's JPEGs on the GPU, got a ConcatDataset: pass gpu=False (its parts are "
            "decoded in the loader's threads), or build one jpeg dataset of all the images"
        )
    first = parts[0]
    for number, part in enumerate(parts):
        if decode is None and isinstance(part, MemmapImageDataset) and part.storage == "jpeg":
            raise UsageError(
                f"part {number} of the ConcatDataset is a jpeg dataset, whose images have their own sizes: pass "
                "decode=gpuload.RandomResizedCropDecode(224) (training) or decode=gpuload.CenterCropDecode(224) "
                "(evaluation), which crops every part to one size, got decode=None"
            )
        if decode is None and _image_shape(part) != _image_shape(first):
            raise UsageError(
                f"the parts of a ConcatDataset stack into one batch: part 0 holds images {list(_image_shape(first))}, "
                f"part {number} {list(_image_shape(part))}: pass a decode= crop (gpuload.CenterCropDecode(224), "
                "gpuload.RandomResizedCropDecode(224)), which crops every part to one size, or build them at one --size"
            )
        if _specs(part) != _specs(first):
            raise UsageError(
                f"the parts of a ConcatDataset serve one kind of batch: part 0 has the fields {_specs(first) or 'none'}, "
                f"part {number} {_specs(part) or 'none'}: build them with the same fields, or use one loader per dataset"
            )
        masks = sorted(name for name, column in _fields(part).items() if column.spec.kind == "mask")
        if masks:
            raise UsageError(
                f"part {number} of the ConcatDataset holds the segmentation mask {masks[0]!r}, and a ConcatDataset's "
                "masks are not served yet (their crops follow each dataset's own): use one loader per dataset, or "
                "build one dataset from all the sources"
            )
        _check_classes(getattr(first, "classes", None) or [], getattr(part, "classes", None) or [], number)


def _check_classes(first: list[str], other: list[str], number: int) -> None:
    """A label means one class in every part: two parts' class lists agree where both have one (one is the
    start of the other). torch's ConcatDataset mixes the label spaces of ImageFolders with other classes silently."""
    for label, (name, other_name) in enumerate(zip(first, other)):
        if name != other_name:
            raise UsageError(
                f"label {label} is class {name!r} in part 0 of the ConcatDataset and {other_name!r} in part {number}: "
                "their labels would mix two label spaces; build the datasets from folders with the same classes "
                "(an empty folder for a class one of them lacks), or one dataset from all the class folders"
            )


def _image_shape(part: Part) -> tuple[int, ...]:
    """A raw part's image shape ``(C, H, W)``; ``()`` for a jpeg dataset (each image its own size)."""
    if isinstance(part, MemmapImageDataset):
        return tuple(part.image_shape or ())
    return tuple(part.images.shape[1:])


def _labels(part: Part) -> torch.Tensor:
    data = part.data if isinstance(part, MemmapImageDataset) else part
    return torch.Tensor.as_subclass(data.labels, torch.Tensor)


def _fields(part: Part) -> dict:
    return part.fields if isinstance(part, MemmapImageDataset) else {}


def _specs(part: Part) -> str:
    """A part's fields as a message shows them, by name: ``"score (number float32 [])"``; a multi-label
    field with its classes (another list is another label space)."""
    return ", ".join(
        f"{name} ({spec.kind} {spec.dtype} {list(spec.shape)}"
        + (f" of {', '.join(spec.classes)})" if spec.classes else ")")
        for name, spec in sorted((name, column.spec) for name, column in _fields(part).items())
    )
