"""``gpuload push``: copy a built dataset to a URL, checked object by object, resumable, manifest last.

A dataset at a URL is the same folder as on disk, one object per file. The push:

1. checks that the local dataset is complete and intact (``gpuload verify``: manifest, files, every
   image's checksum), so that nothing damaged is ever published;
2. looks at what the URL holds: nothing, a push that did not finish (its marker ``.gpuload-push.json``
   is there, with objects named like a dataset's files and no manifest), this same dataset (a
   manifest with the same digests), another gpuload dataset (replaced only with ``overwrite``), or
   anything else, such as a user's own ``meta.json`` with no marker (refused, even with ``overwrite``);
3. decides which objects already hold their file's bytes (below), without downloading them where it can;
4. writes its marker, holding a token of its own, then removes the manifest at the URL before it
   changes any object there (a dataset whose objects are being replaced is not taken for a
   dataset), and with ``overwrite`` the objects the new dataset does not have, and the temporary
   files of a ``file://`` upload that was killed; it aborts the unfinished multipart uploads that a
   failed or killed push left under the URL (named like a dataset's files: a user's own are left
   alone), but resumes the newest of each object it uploads;
5. uploads every file but the manifest whose object is missing or differs (an object larger than
   its part size in parts, see :func:`~gpuload.remote.store.part_size`: each part retried on its
   own, a resumed upload's parts kept where their size and MD5 match), and checks each object by
   reading it back: same size, and the xxh3-64 of its bytes as a reader gets them (ranged GETs
   carrying the ETag the upload returned) equal to the local file's;
6. checks that the marker still holds its token and every object the version it uploaded or
   checked, uploads ``manifest.json`` last, reads it back, checks again, and removes the marker:
   until then the URL holds no dataset. Two pushes to one URL at once: the one that started first
   stops with an error when it sees the other's token, and the other stops if an object it wrote
   was replaced meanwhile (object stores give no lock that works on every backend; this check
   leaves a window of one request).

**The push record.** Beside the manifest, ``.gpuload-pushed.json`` records, for each object a push
uploaded and read back (or read back and found equal), its size, its ETag (on ``file://``, its
modification time) and the xxh3-64 of its bytes: ``{"format": "gpuload.push-record", "version": 1,
"objects": {name: {"size", "etag", "xxh3"}}}``. It is rewritten after each object uploaded, so that an
interrupted push's finished objects are vouched for too. A later push believes an object whose listed
size and ETag are the recorded ones and whose recorded xxh3-64 is the local file's: it reads nothing
back (re-running a push that has nothing left to do costs one LIST and two small GETs, the record and
the manifest, where it downloaded the whole dataset). Any other object of the local file's size is read
back and compared, and with ``verify`` (``gpuload push --verify``) every object is.

Why read back rather than the backends' checksums: S3's ETag is an MD5 only for single-part uploads
without KMS encryption, multipart ETags and ``x-amz-checksum-*`` depend on the part size the client
chose, and HTTP servers or ``file://`` give none; reading back checks, on every backend, the bytes
that readers will get, through the same code path. The ETag then stands for those bytes: an object
replaced gets another.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ..errors import DatasetError, UsageError
from ..format.manifest import ARRAYS, MANIFEST_NAME, Manifest
from ..text import byte_size, count
from ..writing.files import OutputLock, resolve
from .dataset import PUSH_MARKER, read_remote_manifest
from .file import object_digest
from .store import ObjectInfo, RemoteError, Store, Upload, open_store

__all__ = ["PUSH_RECORD", "PushReport", "push_memmap"]

# What each object a push checked held (see the module's docstring).
PUSH_RECORD = ".gpuload-pushed.json"
_RECORD_FORMAT = "gpuload.push-record"

_CHUNK = 8 * 2**20
# The names a dataset of any storage holds (besides the manifest): what a half-pushed dataset may hold.
_DATASET_NAMES = frozenset({"meta.json", *(f"{name}.memmap" for names in ARRAYS.values() for name in names)})
# A file:// upload killed before its rename leaves ``.<name>.tmp-<pid>-<thread>`` (remote.py's _put).
_LEFTOVER = re.compile(r"^\.(?P<name>[^/]+)\.tmp-(?P<pid>\d+)-\d+$")


@dataclass
class PushReport:
    """What :func:`push_memmap` did.

    Attributes:
        url: where the dataset is now (redacted).
        uploaded: the names of the objects uploaded, each read back (the manifest last).
        skipped: the objects that were already there with the right bytes.
        read_back: the objects already there that were read back to compare (no push record vouched
            for them, or ``verify``); those that differed were uploaded again.
        removed: objects of a replaced dataset that the new one does not have.
        aborted: the objects whose unfinished multipart uploads (a failed or killed push's) were aborted.
        bytes_uploaded: bytes of the objects uploaded (a resumed upload's kept parts included).
        seconds: the whole push.
    """

    url: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    read_back: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"pushed to {self.url}: {count(len(self.uploaded), 'object')} uploaded ({byte_size(self.bytes_uploaded)}), "
            f"{len(self.skipped)} already there, {len(self.removed)} removed"
            + (f", {len(self.read_back)} read back to compare" if self.read_back else "")
            + (f", {count(len(self.aborted), 'unfinished upload')} aborted" if self.aborted else "")
            + f", {self.seconds:.1f} s"
        )


def push_memmap(
    src: str | os.PathLike,
    url: str,
    *,
    overwrite: bool = False,
    verify: bool = False,
    progress: bool = True,
    store: Store | None = None,
) -> PushReport:
    """Copy the dataset ``src`` to the folder URL ``url`` (see the module's docstring for the steps).

    Args:
        src: a local dataset folder that ``build-memmap`` wrote.
        url: ``s3://bucket/path``, ``gs://...``, ``az://...``, ``file:///...`` (HTTP is read-only).
        overwrite: replace another gpuload dataset at ``url`` (never anything else).
        verify: read back every object already at ``url`` and compare it with the local file, even
            those the push record vouches for (by default only the others are read back).
        progress: show a progress bar of the bytes checked and uploaded.
        store: the store of ``url`` (default: :func:`~gpuload.remote.store.open_store`).

    Raises:
        DatasetError: ``src`` is not a complete, intact dataset (what ``gpuload verify`` found first).
        FileExistsError: ``url`` holds another gpuload dataset and ``overwrite`` is false.
        UsageError: ``url`` holds objects that are not a gpuload dataset's, or cannot be written.
        RemoteError: an upload failed after its retries, or an object read back differs.
        BusyError: another gpuload run holds ``src``'s lock.

    Example:
        >>> import tempfile
        >>> from gpuload import build_memmap, make_sample_folder
        >>> photos = make_sample_folder(Path(tempfile.mkdtemp()) / "photos", images_per_class=1, size=(12, 16))
        >>> dataset = build_memmap(photos, format="jpeg", progress=False)
        >>> url = f"memory://doc-push/{photos.parent.name}/photos.jpeg"
        >>> report = push_memmap(dataset, url, progress=False)
        >>> report.uploaded[-1], report.skipped
        ('manifest.json', [])
        >>> push_memmap(dataset, url, progress=False).uploaded  # all there already
        []
    """
    from ..format.verify import verify_memmap

    started = time.perf_counter()
    src = resolve(src)
    store = store if store is not None else open_store(url)
    _check_not_inside(src, store)
    with OutputLock(src):
        problems = verify_memmap(src, progress=progress)
        if problems:
            raise DatasetError(
                f"{src} is not intact, so it is not pushed: {problems[0]}"
                + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else "")
                + f"; run gpuload verify {src}"
            )
        manifest = Manifest.read(src)
        names = sorted(manifest.files)  # the manifest goes last, on its own
        report = PushReport(url=store.display)
        existing = store.list()
        record = _read_record(store, existing)
        replace = _check_target(store, existing, manifest, overwrite, record is not None)
        todo = {name: src / name for name in [*names, MANIFEST_NAME]}
        with _progress(sum(path.stat().st_size for path in todo.values()), progress) as bar:
            digests = {name: _local_digest(path) for name, path in todo.items()}
            same = _same_objects(store, existing, todo, digests, record or {}, verify, report, bar)
            entries = {name: _entry(existing[name], digests[name]) for name in todo if same[name]}
            if MANIFEST_NAME in existing and not replace and all(same.values()):
                if PUSH_MARKER in existing:  # a push killed after its manifest landed
                    _abort_unfinished(store, names, {}, report)
                    store.delete(PUSH_MARKER)
                if entries != record:
                    _write_record(store, entries)
                report.skipped = [*names, MANIFEST_NAME]
                report.seconds = time.perf_counter() - started
                return report
            token = _write_marker(store, manifest)
            _check_unchanged(store, existing)
            resume = _abort_unfinished(store, names, same, report)
            if MANIFEST_NAME in existing:
                store.delete(MANIFEST_NAME)  # from now on the URL holds no dataset until the new manifest lands
                existing.pop(MANIFEST_NAME)
                entries.pop(MANIFEST_NAME, None)
            for name in sorted(set(existing) - set(names) - {PUSH_MARKER, PUSH_RECORD}):
                store.delete(name)
                report.removed.append(name)
            versions = {name: existing[name] for name in names if same[name]}
            for name in names:
                if same[name]:
                    report.skipped.append(name)
                    continue
                versions[name] = _upload(store, name, todo[name], digests[name], bar, resume.get(name))
                entries[name] = _entry(versions[name], digests[name])
                _write_record(store, entries)  # an interrupted push's finished objects are vouched for
                report.uploaded.append(name)
                report.bytes_uploaded += manifest.files[name]
            _check_still_ours(store, token, versions)
            versions[MANIFEST_NAME] = _upload(store, MANIFEST_NAME, todo[MANIFEST_NAME], digests[MANIFEST_NAME], bar)
            entries[MANIFEST_NAME] = _entry(versions[MANIFEST_NAME], digests[MANIFEST_NAME])
            report.uploaded.append(MANIFEST_NAME)
            report.bytes_uploaded += todo[MANIFEST_NAME].stat().st_size
            _check_still_ours(store, token, versions, written=True)
            _write_record(store, entries)
            store.delete(PUSH_MARKER)
    report.seconds = time.perf_counter() - started
    return report


def _check_not_inside(src: Path, store: Store) -> None:
    """A ``file://`` URL inside the dataset (or holding it) would write into what is being pushed."""
    if not store.url.lower().startswith("file://"):
        return
    from urllib.parse import unquote, urlparse

    target = Path(unquote(urlparse(store.url).path)).resolve()
    if target == src or target.is_relative_to(src) or src.is_relative_to(target):
        raise UsageError(
            f"{store.display} is {'inside' if target.is_relative_to(src) else 'around'} the dataset {src} that it "
            "would receive; push to a folder outside it"
        )


def _write_marker(store: Store, manifest: Manifest) -> str:
    """Write the push marker with a new token: the URL is being written by this push."""
    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="gpuload-push-") as folder:
        path = Path(folder) / PUSH_MARKER
        path.write_text(json.dumps({"push": token, "images": len(manifest), "created": manifest.created}))
        store.put(PUSH_MARKER, path)
    return token


def _check_still_ours(store: Store, token: str, versions: dict[str, ObjectInfo], *, written: bool = False) -> None:
    """Stop if another push took the URL since this one wrote its marker: the marker holds another
    token, or an object is no longer the version this push uploaded or checked. After the manifest
    was ``written``, it is removed again if it is still this push's (the URL then holds no dataset)."""
    try:
        marker = json.loads(store.read_all(PUSH_MARKER)).get("push")
    except (FileNotFoundError, ValueError, AttributeError):
        marker = None
    found = store.list()
    changed = sorted(name for name, info in versions.items() if found.get(name) != info)
    if marker == token and not changed:
        return
    if written and found.get(MANIFEST_NAME) == versions.get(MANIFEST_NAME):
        store.delete(MANIFEST_NAME)
    what = f"{changed[0]!r} was replaced" if changed else "its push marker was replaced"
    raise RemoteError(
        f"another push wrote {store.display} while this one ran ({what}); nothing there is a dataset now: "
        "run one push at a time to a URL, then this one again (it resumes)"
    )


def _check_target(
    store: Store, existing: dict[str, ObjectInfo], manifest: Manifest, overwrite: bool, recorded: bool
) -> bool:
    """What the URL holds decides: ``True`` to replace another dataset there, ``False`` to write or resume.
    ``recorded``: the push record there is one that push writes (else, if there is one, it is someone else's)."""
    _check_leftovers(store, existing)
    ours = {PUSH_MARKER} | {name for name in existing if _leftover(name)} | ({PUSH_RECORD} if recorded else set())
    if PUSH_MARKER in existing and not _is_marker(store, existing[PUSH_MARKER]):
        ours.discard(PUSH_MARKER)  # not what push writes: someone else's file
    if MANIFEST_NAME not in existing:
        foreign = sorted(set(existing) - _DATASET_NAMES - ours)
        if not foreign and existing and PUSH_MARKER not in existing:
            foreign = sorted(set(existing) - ours)  # a dataset's names, but no push of ours wrote them
        if foreign:
            raise UsageError(
                f"{store.display} holds {count(len(existing), 'object')} and is not a gpuload dataset (it holds {foreign[0]!r}, "
                f"no manifest.json and no {PUSH_MARKER} of an unfinished push); push writes only to an empty "
                "location or over a gpuload dataset (--overwrite): choose another URL or empty it yourself"
            )
        return False  # empty, or a push that did not finish: resumed
    there = _read_manifest(store, existing[MANIFEST_NAME])
    if there.digests == manifest.digests and there.files == manifest.files:
        return False  # the same dataset: resumed or already complete
    owned = there.owned_paths() | ours
    foreign = sorted(set(existing) - owned)
    if foreign:
        raise UsageError(
            f"{store.display} holds a gpuload dataset and also {count(len(foreign), 'object')} it does not list (first "
            f"{foreign[0]!r}); --overwrite replaces only a location that holds nothing but a gpuload dataset: "
            "choose another URL or remove them yourself"
        )
    if not overwrite:
        raise FileExistsError(
            f"{store.display} holds another gpuload dataset ({len(there)} images from {there.source}, built "
            f"{there.created}); pass overwrite=True (--overwrite) to replace it, or choose another URL"
        )
    return True


def _check_unchanged(store: Store, existing: dict[str, ObjectInfo]) -> None:
    """After the marker is written, the URL must hold what it held when it was listed (the marker
    aside): otherwise another push wrote it meanwhile (a manifest that appeared, an object replaced)."""
    found = {name: info for name, info in store.list().items() if name != PUSH_MARKER}
    before = {name: info for name, info in existing.items() if name != PUSH_MARKER}
    if found != before:
        changed = sorted(set(found) ^ set(before)) or sorted(name for name in found if found[name] != before[name])
        raise RemoteError(
            f"another push wrote {store.display} while this one looked at it ({changed[0]!r} changed); run one push "
            "at a time to a URL, then this one again"
        )


def _check_leftovers(store: Store, existing: dict[str, ObjectInfo]) -> None:
    """A temporary file of a ``file://`` upload whose process still runs belongs to a push in progress."""
    if not store.url.startswith("file://"):
        return
    for name in filter(_leftover, existing):
        pid = int(_LEFTOVER.match(name)["pid"])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue  # its writer is gone: a leftover, removed by this push
        except PermissionError:
            pass  # alive, another user's
        raise UsageError(
            f"another push (process {pid}) is writing {store.display} ({name}); wait for it to finish, then push again"
        )


def _is_marker(store: Store, info: ObjectInfo) -> bool:
    """Whether the object named like the push marker holds what push writes there (a JSON token)."""
    try:
        found = json.loads(store.read_all(PUSH_MARKER, info))
    except (ValueError, OSError, RemoteError):
        return False
    return isinstance(found, dict) and isinstance(found.get("push"), str)


def _leftover(name: str) -> bool:
    """Whether ``name`` is the temporary file of a ``file://`` upload of ours that was killed."""
    match = _LEFTOVER.match(name)
    return match is not None and match["name"] in _DATASET_NAMES | {MANIFEST_NAME, PUSH_MARKER}


def _read_manifest(store: Store, info: ObjectInfo) -> Manifest:
    try:
        return read_remote_manifest(store, info)
    except DatasetError as error:
        raise UsageError(
            f"{error}; push never replaces it, even with --overwrite: choose another URL or remove it yourself"
        ) from None


def _same_objects(
    store: Store,
    existing: dict[str, ObjectInfo],
    todo: dict[str, Path],
    digests: dict[str, int],
    record: dict[str, dict],
    verify: bool,
    report: PushReport,
    bar,
) -> dict[str, bool]:
    """Which objects already hold their local file's bytes: vouched for by the push record (the size and
    ETag listed are the recorded ones, the recorded xxh3-64 is the file's; unless ``verify``, or the
    backend gives no ETag), or read back and compared (noted in ``report.read_back``)."""
    same = {}
    for name, path in todo.items():
        info = existing.get(name)
        size = path.stat().st_size
        if info is None or info.size != size:
            same[name] = False
            continue
        if not verify and info.etag is not None and record.get(name) == _entry(info, digests[name]):
            same[name] = True
        else:
            report.read_back.append(name)
            same[name] = object_digest(store, name, info) == digests[name]
        if same[name]:
            bar.update(size)
    return same


def _abort_unfinished(store: Store, names: list[str], same: dict[str, bool], report: PushReport) -> dict[str, Upload]:
    """Abort the unfinished multipart uploads under the URL that a push left (named like a dataset's
    objects; a user's own are left alone), but the newest of each object to upload: returned, to resume."""
    resume: dict[str, Upload] = {}
    pushes = _DATASET_NAMES | {MANIFEST_NAME, PUSH_MARKER, PUSH_RECORD}
    newest_first = sorted(store.uploads(), key=lambda upload: upload.initiated.timestamp() if upload.initiated else 0)
    for upload in reversed(newest_first):
        if upload.name not in pushes:
            continue
        if upload.name in names and not same.get(upload.name) and upload.name not in resume:
            resume[upload.name] = upload
        else:
            store.abort(upload)
            report.aborted.append(upload.name)
    report.aborted.sort()
    return resume


def _upload(store: Store, name: str, path: Path, digest: int, bar, resume: Upload | None = None) -> ObjectInfo:
    """Upload ``path`` as ``name`` (``resume``: an unfinished upload of it), read it back and check it;
    returns the version stored."""
    info = store.put(name, path, resume=resume)
    size = path.stat().st_size
    if info.size != size:
        raise RemoteError(
            f"{store.object_url(name)} has {info.size:,} bytes after its upload, the file {path} has {size:,}; "
            "push again (it resumes)"
        )
    if object_digest(store, name, info) != digest:
        raise RemoteError(
            f"{store.object_url(name)} reads back other bytes than {path} after its upload (checksums differ); "
            "push again (it resumes); if it happens again, the storage is damaging data"
        )
    bar.update(size)
    return info


def _entry(info: ObjectInfo, digest: int) -> dict:
    """The push record's entry of an object: its version, and the xxh3-64 of its bytes."""
    return {"size": info.size, "etag": info.etag, "xxh3": f"{digest:016x}"}


def _read_record(store: Store, existing: dict[str, ObjectInfo]) -> dict[str, dict] | None:
    """The push record's entries by object, or ``None`` where there is none that push wrote."""
    if PUSH_RECORD not in existing:
        return None
    try:
        found = json.loads(store.read_all(PUSH_RECORD, existing[PUSH_RECORD]))
    except (ValueError, FileNotFoundError):  # not JSON; removed meanwhile
        return None
    if (
        not isinstance(found, dict)
        or found.get("format") != _RECORD_FORMAT
        or not isinstance(found.get("objects"), dict)
    ):
        return None
    return found["objects"]


def _write_record(store: Store, entries: dict[str, dict]) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuload-push-") as folder:
        path = Path(folder) / PUSH_RECORD
        path.write_text(json.dumps({"format": _RECORD_FORMAT, "version": 1, "objects": entries}, sort_keys=True))
        store.put(PUSH_RECORD, path)


def _local_digest(path: Path) -> int:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.intdigest()


class _progress:
    """A tqdm bar of bytes on stderr, or nothing."""

    def __init__(self, total: int, show: bool) -> None:
        self.total, self.show, self.bar = total, show, None

    def __enter__(self):
        if self.show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit="B", unit_scale=True, desc="push", file=sys.stderr)
        return self

    def update(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def __exit__(self, *exc_info) -> None:
        if self.bar is not None:
            self.bar.close()
