"""The named fields a dataset holds beside its images and labels: numbers, multi-label, text, masks.

A dataset of format version 4 records each field in its manifest's ``fields`` list (name, kind,
dtype, shape; a multi-label field its classes too) and keeps it per image, in dataset order, in flat
files under ``fields/``, mapped at open (nothing per image in memory):

- ``number``: int64, float32 or bool, a scalar (shape ``[]``) or a vector of fixed length (``[k]``):
  ``fields/<name>.memmap``, ``[N, *shape]``;
- ``multilabel``: a set of the field's classes, served as a float32 multi-hot vector ``[C]``:
  ``fields/<name>.memmap`` (int32 class indices, one image's after the other) and
  ``fields/<name>.offsets.memmap`` (int64 ``[N + 1]``: image ``i``'s are ``offsets[i]:offsets[i + 1]``);
- ``text``: a ``str``: ``fields/<name>.memmap`` (UTF-8) and ``fields/<name>.offsets.memmap``;
- ``mask``: a segmentation mask of uint8 class ids, the size of its image: in a raw dataset shape
  ``[H, W]`` (the images' stored size), ``fields/<name>.memmap`` ``[N, H, W]``, fitted as its image was
  (nearest neighbour, :data:`MASK_FILL` where padded); in a jpeg dataset shape ``[]``, each image's
  mask as the 8-bit PNG it came as, ``fields/<name>.memmap`` and ``fields/<name>.offsets.memmap``.

The numbers and raw masks are a nested ``TensorDict`` of plain tensordict (``fields/meta.json``):
``TensorDict.load_memmap(DIR)["fields", "boxes"]``. Every file of a field is an index file: digested
in the manifest's ``table``, read whole at a URL; except a mask's ``fields/<name>.memmap``, as large as
the images and read by range as they are (:class:`gpuload.remote.masks.RemoteMasks`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "FIELDS_FOLDER",
    "KINDS",
    "MASK_FILL",
    "NAME",
    "NUMBER_DTYPES",
    "RESERVED",
    "FieldSpec",
    "describe_fields",
    "field_path",
]

FIELDS_FOLDER = "fields"
KINDS = ("number", "multilabel", "text", "mask")
# A number's dtype -> how its file stores it (numpy's name; a bool as one byte, 0 or 1).
NUMBER_DTYPES = {"int64": "<i8", "float32": "<f4", "bool": "u1"}
_STORED = {**NUMBER_DTYPES, "uint8": "u1"}  # and a raw mask's class ids
# The class id of a mask's pixels that its image does not cover (a padded build, an evaluation crop
# wider than its image): the ``ignore_index`` of ``F.cross_entropy(..., ignore_index=255)``.
MASK_FILL = 255
# A field's name is a file name and a key: letters, digits and underscores, not starting with a digit.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The names a sample already uses for its image and label.
RESERVED = frozenset({"images", "labels", "image", "label"})


def field_path(name: str, suffix: str = "") -> str:
    """The relative path of one of field ``name``'s files (``suffix``: ``""``, ``"offsets"``, ``"checksums"``).

    Example:
        >>> field_path("caption", "offsets")
        'fields/caption.offsets.memmap'
    """
    return f"{FIELDS_FOLDER}/{name}{'.' + suffix if suffix else ''}.memmap"


@dataclass(frozen=True)
class FieldSpec:
    """One field as the manifest records it.

    Attributes:
        name: its key in a sample and a batch.
        kind: ``"number"``, ``"multilabel"``, ``"text"`` or ``"mask"``.
        dtype: a number's ``"int64"``, ``"float32"`` or ``"bool"``; ``"float32"`` for multi-label (the
            multi-hot vector served), ``"str"`` for text, ``"uint8"`` for a mask.
        shape: what one sample holds: ``[]`` or ``[k]`` for a number, ``[C]`` for multi-label, ``[]`` for
            text; a mask ``[H, W]`` in a raw dataset, ``[]`` (each its image's size, a PNG) in a jpeg one.
        classes: multi-label: the class names, a class's index its position.

    Example:
        >>> spec = FieldSpec.from_json({"name": "boxes", "kind": "number", "dtype": "float32", "shape": [4]})
        >>> spec.files(), spec.row_bytes()
        (('fields/boxes.memmap',), 16)
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    classes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        entry = {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape)}
        if self.kind == "multilabel":
            entry["classes"] = list(self.classes)
        return entry

    @classmethod
    def from_json(cls, entry: object) -> FieldSpec:
        """A spec from its manifest entry.

        Raises:
            ValueError: the entry is not a valid field (what is wrong said).
        """
        if not isinstance(entry, dict):
            raise ValueError(f"a field must be an object, got {entry!r}")
        keys = {"name", "kind", "dtype", "shape"} | ({"classes"} if entry.get("kind") == "multilabel" else set())
        if set(entry) != keys:
            raise ValueError(f"a field of kind {entry.get('kind')!r} has the keys {sorted(keys)}, got {sorted(entry)}")
        name, kind, dtype, shape = entry["name"], entry["kind"], entry["dtype"], entry["shape"]
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
            raise ValueError(f"field name {name!r} is not a name of letters, digits and _ (nor images or labels)")
        if kind not in KINDS:
            raise ValueError(f"field {name!r} has kind {kind!r}, not one of {', '.join(KINDS)}")
        if not isinstance(shape, list) or not all(isinstance(side, int) and side >= 1 for side in shape):
            raise ValueError(f"field {name!r} has shape {shape!r}, not a list of positive sizes")
        expected = {
            "number": (tuple(NUMBER_DTYPES), (0, 1)),
            "multilabel": (("float32",), (1,)),
            "text": (("str",), (0,)),
            "mask": (("uint8",), (0, 2)),
        }[kind]
        if dtype not in expected[0] or len(shape) not in expected[1]:
            raise ValueError(f"field {name!r} of kind {kind} cannot have dtype {dtype!r} and shape {shape}")
        classes = entry.get("classes", [])
        if kind == "multilabel" and (
            not isinstance(classes, list)
            or not all(isinstance(item, str) and item for item in classes)
            or len(set(classes)) != len(classes)
            or [len(classes)] != shape
        ):
            raise ValueError(f"field {name!r}: classes must be {shape[0]} distinct names, got {classes!r}")
        return cls(name, kind, dtype, tuple(shape), tuple(classes))

    @property
    def fixed(self) -> bool:
        """Whether its file holds ``[N, *shape]`` values of :attr:`stored_dtype`, one per image (a number, a
        raw dataset's mask), rather than values cut by offsets."""
        return self.kind == "number" or (self.kind == "mask" and bool(self.shape))

    @property
    def stored_dtype(self) -> str:
        """How a fixed-shape field's file stores a value (numpy's name)."""
        return _STORED[self.dtype]

    def files(self) -> tuple[str, ...]:
        """Its files' relative paths in a dataset, each digested in the manifest's ``table`` (and read whole at a
        URL, but for a mask's data)."""
        if self.fixed:
            return (field_path(self.name),)
        return (field_path(self.name), field_path(self.name, "offsets"))

    def row_bytes(self) -> int:
        """Bytes of one image's value in ``fields/<name>.memmap`` (fixed-shape fields)."""
        return int(self.stored_dtype[-1]) * math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        """What a batch of it holds (a multi-hot vector's: float32)."""
        import torch  # here: the command line's --help imports this module

        return {"int64": torch.int64, "float32": torch.float32, "bool": torch.bool, "uint8": torch.uint8}[self.dtype]


def describe_fields(specs: Sequence[FieldSpec]) -> list[str]:
    """One line per field, as ``gpuload info`` shows them.

    Example:
        >>> describe_fields([FieldSpec("boxes", "number", "float32", (4,))])
        ['boxes: number float32 [4]']
    """
    lines = []
    for spec in specs:
        shape = f" [{', '.join(map(str, spec.shape))}]" if spec.shape else ""
        extra = f" ({len(spec.classes)} classes)" if spec.kind == "multilabel" else ""
        extra += " (a PNG per image)" if spec.kind == "mask" and not spec.shape else ""
        lines.append(f"{spec.name}: {spec.kind} {spec.dtype}{shape}{extra}")
    return lines
