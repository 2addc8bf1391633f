"""A dataset at a URL, opened: its manifest, the versions of its objects, its index read whole, and checks.

:func:`open_remote` is what a dataset opened from a URL starts from (phase 2 builds
``MemmapImageDataset(url, cache=...)`` on it): it reads the manifest, checks every object the manifest
lists against its size and records its ETag (the version every later read carries), reads the index
arrays whole (raw: ``labels``; jpeg: ``offsets``, ``shapes``, ``labels``, 24 bytes an image) and checks
them as a local open does. Image bytes are then read on demand through :meth:`RemoteIndex.image_file`,
and a mask field's through its column (:class:`~gpuload.remote.masks.RemoteMasks`).
:func:`describe_remote` and :func:`verify_remote` are ``gpuload info`` and ``gpuload verify`` for URLs.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from ..errors import DatasetError, UsageError
from ..format.columns import FieldColumn
from ..format.dataset import check_meta_shape
from ..format.fields import field_path
from ..format.manifest import MANIFEST_NAME, Manifest
from ..text import count, either
from .file import DEFAULT_BLOCK_SIZE, RemoteFile, object_digest
from .masks import RemoteMasks
from .store import ObjectInfo, Store, open_store

if TYPE_CHECKING:
    from ..format.verify import Verification
    from .cache import BlockCache, Namespace
from ..format.table import SampleTable

__all__ = ["RemoteIndex", "describe_remote", "open_remote", "read_remote_manifest", "verify_remote"]

# Written first and removed last by ``gpuload push``: a URL that holds it and no manifest holds a push
# that did not finish.
PUSH_MARKER = ".gpuload-push.json"
_BATCH = 256  # images checked per read_many


@dataclass
class RemoteIndex:
    """A dataset at a URL, as opened: what reading its images needs, all in memory.

    Attributes:
        store: the dataset's folder.
        manifest: its manifest, checked as a local one is.
        objects: every object the manifest lists, with the size and ETag seen at open.
        table: each image's path, label and checksum (:class:`gpuload.format.table.SampleTable`).
        starts, lengths: int64 ``[N]``: each image's byte range in the image object.
        shapes: jpeg: int32 ``[N, 2]`` (height, width) of each image; raw: ``None``.
        fields: each named field's values (its index objects read whole, as the table's; a mask's data
            read by range, see :class:`~gpuload.remote.masks.RemoteMasks`).
    """

    store: Store
    manifest: Manifest
    objects: dict[str, ObjectInfo]
    table: SampleTable
    starts: np.ndarray
    lengths: np.ndarray
    shapes: np.ndarray | None
    manifest_info: ObjectInfo | None = None
    fields: dict[str, FieldColumn] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """A fingerprint of the versions seen at open: every object's size and ETag, the manifest's too."""
        versions = sorted((name, info.key()) for name, info in self.objects.items())
        versions.append((MANIFEST_NAME, self.manifest_info.key() if self.manifest_info else ""))
        return f"{xxhash.xxh3_64_intdigest(json.dumps(versions).encode()):016x}"

    @property
    def labels(self) -> np.ndarray:
        """int64 ``[N]``: each image's label."""
        return self.table.labels

    @property
    def image_object(self) -> str:
        """The object holding the images' bytes: ``data.memmap`` (jpeg) or ``images.memmap`` (raw)."""
        return self.manifest.array_path("data" if self.manifest.storage == "jpeg" else "images")

    def image_file(self, **options) -> RemoteFile:
        """A :class:`RemoteFile` of the image object, at the version seen at open (``options``: its
        ``cache``, ``block_size``...)."""
        name = self.image_object
        return RemoteFile(self.store, name, info=self.objects[name], **options)

    def checksums(self) -> np.ndarray:
        """uint64 ``[N]``: each image's xxh3-64, as built."""
        return self.table.checksums


def read_remote_manifest(store: Store, info: ObjectInfo | None = None) -> Manifest:
    """The ``manifest.json`` at ``store``, checked as a local one is (:meth:`Manifest.read`).

    Raises:
        DatasetError: no manifest (with the advice for an unfinished push when other objects are
            there), or one that is not valid.
    """
    try:
        info = info or store.info(MANIFEST_NAME)
    except FileNotFoundError:
        try:
            unfinished = PUSH_MARKER in store.list()
        except UsageError:  # an HTTP server cannot be listed
            unfinished = False
        if unfinished:
            raise DatasetError(
                f"{store.display} has no {MANIFEST_NAME} and holds a push that did not finish; run gpuload push again"
            ) from None
        raise DatasetError(f"{store.display} is not a gpuload dataset: it has no {MANIFEST_NAME}") from None
    data = store.read_all(MANIFEST_NAME, info)
    with tempfile.TemporaryDirectory(prefix="gpuload-manifest-") as folder:
        (Path(folder) / MANIFEST_NAME).write_bytes(data)
        try:
            return Manifest.read(folder)
        except DatasetError as error:
            reason = str(error).replace(str(Path(folder) / MANIFEST_NAME), "its manifest.json").replace(folder, "it")
            raise DatasetError(f"{store.display} is not a valid gpuload dataset: {reason}") from None


def open_remote(url: str | Store, cache: BlockCache | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> RemoteIndex:
    """Open the dataset at ``url`` (or a store of it): manifest, object versions, index (see the module).

    With a ``cache`` (format version 4), each index object is kept in it whole, as one block, and
    mapped from there: nothing of it in this process's memory until read, its pages shared by every
    process of the node, and a warm open downloads none of it. Each copy is checked against the
    build's digest of the file (the manifest's ``table``) at every open: a block that a power cut
    damaged is fetched again. A mask field's data is not an index object: its column
    (:class:`~gpuload.remote.masks.RemoteMasks`) reads each mask by range when asked, through ``cache``
    in blocks of ``block_size`` bytes, as the images are read.

    Raises:
        DatasetError: not a gpuload dataset, an unfinished push, an object missing or of another size
            than the manifest says, index arrays that disagree with the manifest.
        RemoteError: a request failed after its retries.
    """
    store = url if isinstance(url, Store) else open_store(url)
    try:
        manifest_info = store.info(MANIFEST_NAME)
    except FileNotFoundError:
        manifest_info = None  # read_remote_manifest says why there is no dataset
    manifest = read_remote_manifest(store, manifest_info)
    if manifest.format_version == 1:
        raise DatasetError(f"{store.display} is a dataset of format version 1; build it again with this gpuload")
    objects = {}
    for name, size in sorted(manifest.files.items()):
        try:
            info = store.info(name)
        except FileNotFoundError:
            raise DatasetError(f"{store.display} is damaged: {name} is missing; push the dataset again") from None
        if info.size != size:
            raise DatasetError(
                f"{store.display} is damaged: {name} has {info.size:,} bytes, the manifest says {size:,}; push the "
                "dataset again"
            )
        objects[name] = info
    count = len(manifest)
    mappings: list[mmap.mmap] = []

    def array(name: str, dtype, shape) -> np.ndarray:
        if manifest.format_version >= 4:
            buffer = _index_object(store, name, objects[name], manifest.table[name], cache, mappings)
        else:
            buffer = bytearray(store.read_all(name, objects[name]))  # writable, as a local dataset's mapping
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)

    if manifest.format_version >= 4:
        table = SampleTable(
            array("labels.memmap", np.int64, (count,)),
            array("checksums.memmap", np.int64, (count,)).view(np.uint64),
            array("paths.memmap", np.uint8, (-1,)),
            array("path_offsets.memmap", np.int64, (count + 1,)),
        )
        table.check(store.display, len(manifest.classes))
    else:
        table = SampleTable.from_lists(manifest.samples, manifest.checksums)
        table.labels = array("labels.memmap", np.int64, (count,))
    if manifest.storage == "jpeg":
        if manifest.format_version >= 4:
            bounds = array("offsets.memmap", np.int64, (count, 2))
            starts, ends = bounds[:, 0], bounds[:, 1]
        else:
            offsets = array("offsets.memmap", np.int64, (count + 1,))
            starts, ends = offsets[:-1], offsets[1:]
        shapes = array("shapes.memmap", np.int32, (count, 2))
        lengths = ends - starts
        if (starts < 0).any() or (lengths <= 0).any() or int(ends.max()) > manifest.files["data.memmap"]:
            raise DatasetError(
                f"{store.display} is damaged: offsets.memmap does not cut data.memmap into {count} images"
            )
        if (shapes <= 0).any():
            raise DatasetError(f"{store.display} is damaged: shapes.memmap holds a size that is not positive")
    else:
        check_meta_shape(  # as a local open checks it
            manifest,
            lambda: store.read_all("meta.json", objects["meta.json"]),
            store.display,
            "push the dataset again",
            "push the dataset again from an intact copy",
        )
        size = int(np.prod(manifest.image_shape))
        starts, lengths, shapes = np.arange(count, dtype=np.int64) * size, np.full(count, size, dtype=np.int64), None
    manifest.check_labels(table.labels, store.display, "push the dataset again")
    fields: dict[str, FieldColumn] = {}
    for spec in manifest.field_specs:
        offsets = None if spec.fixed else array(field_path(spec.name, "offsets"), np.int64, (count + 1,))
        if spec.kind == "mask":  # as large as the images: read by range, as they are
            name = field_path(spec.name)
            file = RemoteFile(store, name, info=objects[name], cache=cache, block_size=block_size)
            fields[spec.name] = RemoteMasks(spec, file, offsets, count)
        elif spec.fixed:
            fields[spec.name] = FieldColumn(
                spec, {"data": array(field_path(spec.name), spec.stored_dtype, (-1,))}, count
            )
        else:
            ragged = np.int32 if spec.kind == "multilabel" else np.uint8
            data = array(field_path(spec.name), ragged, (-1,))
            fields[spec.name] = FieldColumn(spec, {"data": data, "offsets": offsets}, count)
        fields[spec.name].check(store.display)
    for mapping in mappings:  # the pages the checks read leave this process (the page cache keeps them)
        mapping.madvise(mmap.MADV_DONTNEED)
    return RemoteIndex(store, manifest, objects, table, starts, lengths, shapes, manifest_info, fields)


def _index_object(
    store: Store, name: str, info: ObjectInfo, digest: str, cache: BlockCache | None, mappings: list[mmap.mmap]
) -> bytearray | mmap.mmap:
    """The bytes of index object ``name`` (format version 4), checked against its build ``digest``: mapped
    from ``cache`` (fetched into it whole, as one block, when missing or damaged), or read into memory.

    Raises:
        DatasetError: the object's bytes at the URL are not the ones built.
    """
    if cache is None:
        return bytearray(_fetch_index_object(store, name, info, digest))  # writable, as a local dataset's mapping
    space = cache.namespace(store.object_url(name), info.key(), block_size=max(1, info.size))
    mapping = _cached_block(cache, space, info.size, digest)
    if mapping is None:
        with cache.writing(space, 0) as held:  # one process of the node fetches it; the others wait and map it
            mapping = _cached_block(cache, space, info.size, digest) if held else None
            if mapping is None:
                data = _fetch_index_object(store, name, info, digest)
                if held and info.size and cache.put(space, 0, data):
                    mapping = _map_block(space.folder / "0", info.size)
                if mapping is None:  # not kept (no room), or evicted at once by another process
                    return bytearray(data)
    mappings.append(mapping)
    return mapping


def _fetch_index_object(store: Store, name: str, info: ObjectInfo, digest: str) -> bytes:
    data = store.read_all(name, info)
    if _digest(data) != digest:
        raise DatasetError(f"{store.display} is damaged: {name} differs from what was built; push the dataset again")
    return data


def _cached_block(cache: BlockCache, space: Namespace, size: int, digest: str) -> mmap.mmap | None:
    """The cached copy of an index object, mapped, if it is there and intact; a damaged one (blocks are
    not fsync'd: a power cut leaves zeros) is dropped."""
    if not cache.has(space, 0, size):
        return None
    mapping = _map_block(space.folder / "0", size)
    if mapping is not None and _digest(mapping) == digest:
        return mapping
    cache.drop(space, 0)
    return None


def _map_block(path: Path, size: int) -> mmap.mmap | None:
    """A cached block mapped copy-on-write (writable arrays, as a local dataset's; nothing written back);
    ``None`` when it is gone or not ``size`` bytes. The mapping outlives an eviction (which unlinks)."""
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        return None
    with file:
        if size == 0 or os.fstat(file.fileno()).st_size != size:
            return None
        return mmap.mmap(file.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _digest(data: bytes | mmap.mmap) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def describe_remote(url: str) -> dict:
    """What the dataset at ``url`` holds, as :func:`gpuload.describe_memmap` gives it for a folder.

    Raises:
        DatasetError: see :func:`open_remote`.
    """
    index = open_remote(url)
    size = sum(info.size for info in index.objects.values()) + index.store.info(MANIFEST_NAME).size
    return index.manifest.describe(index.store.display, size, index.labels)


def verify_remote(url: str, *, progress: bool = True) -> Verification:
    """Check the dataset at ``url`` as ``gpuload verify`` checks a folder; returns the problems found (a
    :class:`gpuload.format.verify.Verification`, whose ``checked`` says what was checked).

    Reads every image once (ranged reads, no cache) and compares its checksum; also the manifest's
    digests, the objects' sizes, the labels, the index and the digest of each mask field's data.

    Raises:
        UsageError: ``url`` holds no dataset at all.
    """
    from tqdm.auto import tqdm

    from ..format.verify import Verification
    from ..writing.jpeg import frame_size

    store = open_store(url)
    try:
        index = open_remote(store)
    except DatasetError as error:
        if "is not a gpuload dataset" in str(error):
            raise UsageError(f"{error}; pass the URL that gpuload push wrote") from None
        return Verification([str(error)], "the manifest and the objects it lists, as far as they open")
    manifest = index.manifest
    problems = [
        f"manifest.json: the field {name!r} was changed after the build (its digest differs); rebuild the dataset"
        for name in manifest.edited_fields()
    ]
    masks = [field_path(spec.name) for spec in manifest.field_specs if spec.kind == "mask"]
    problems += [  # read by range, not at open: their build digests checked here
        f"{name} differs from what was built (its digest differs): the masks in it are damaged; push the dataset "
        "again from an intact copy"
        for name in masks
        if f"{object_digest(store, name, index.objects[name]):016x}" != manifest.table[name]
    ]
    checksums, bad, resized = index.checksums(), [], []
    images = len(manifest)
    with (
        index.image_file(workers=8) as file,
        tqdm(total=images, desc="checksums", unit="img", disable=not progress, file=sys.stderr) as bar,
    ):
        for first in range(0, images, _BATCH):
            positions = range(first, min(images, first + _BATCH))
            ranges = [(int(index.starts[i]), int(index.lengths[i])) for i in positions]
            for position, data in zip(positions, file.read_many(ranges)):
                if xxhash.xxh3_64_intdigest(data) != checksums[position]:
                    bad.append(position)
                elif index.shapes is not None and frame_size(data) != tuple(index.shapes[position].tolist()):
                    resized.append(position)
            bar.update(len(positions))
    if bad:
        shown = ", ".join(f"{i} ({index.table.path(i)})" for i in bad[:5])
        problems.append(
            f"{count(len(bad), 'image')} {either(len(bad), 'does not match its', 'do not match their')} "
            f"build checksum: {shown}"
        )
    if resized:
        shown = ", ".join(f"{i} ({index.table.path(i)})" for i in resized[:5])
        problems.append(
            f"{count(len(resized), 'image')} {either(len(resized), 'differs from its', 'differ from their')} "
            f"size in shapes.memmap: {shown}"
        )
    checked = (
        f"the manifest and the {count(len(index.objects), 'object')} it lists (sizes, ETags, digests"
        + (", the masks' data read whole for it" if masks else "")
        + "), "
        f"{count(images, 'label')}, {count(images, 'image')} read once against {either(images, 'its', 'their')} "
        "build checksum" + (" and recorded size" if index.shapes is not None else "")
    )
    return Verification(problems, checked)
