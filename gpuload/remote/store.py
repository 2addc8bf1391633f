"""Datasets in object storage: URLs, stores, ranged reads with retries, and secrets kept out of messages.

A dataset at a URL is the same folder as on disk (``manifest.json``, ``meta.json``, the ``*.memmap``
arrays), one object per file. :func:`open_store` turns a URL into a :class:`Store`, which reads byte
ranges of those objects, says their size and version (:class:`ObjectInfo`), lists, uploads and
deletes them. Two kinds of store sit behind one interface:

- ``s3://``, ``gs://``, ``az://`` go through obstore (Rust ``object_store``) when it is installed
  (``pip install 'gpuload[cloud]'``), otherwise through fsspec's filesystem for the scheme (s3fs,
  gcsfs, adlfs). obstore fetched 1 and 4 MiB blocks 15-25 % faster than s3fs and image-sized
  ranges 1.6x faster; s3fs was 4-8 % ahead with 16 MiB blocks (``experiments/remote_reads.py``,
  ``assets/results/remote_reads.json``, loopback, 2-core VM).
- every other URL fsspec knows (``https://``, ``file://``, ``memory://``...) goes through fsspec.

Every read is checked: it must return exactly the bytes asked for, and it carries the version seen
when the object was opened, so that an object replaced under a running job stops the job instead of
mixing two versions (:class:`ObjectChangedError`). What each backend gives for that: S3 through
obstore or s3fs, GCS and Azure through obstore: ``If-Match: <etag>`` on every GET, answered with
412 by the server; ``https://``: the same header, honoured by servers that support it (S3 presigned
URLs, nginx, our test server), ignored by others; ``file://``: the file's size and modification time
are compared after every read; fsspec's gcsfs and adlfs: nothing per read (the checksum of every
image still catches mixed bytes).

Connection resets, timeouts (each request has a total deadline besides its connect and read
timeouts), HTTP 5xx, 429 (``SlowDown``) and short reads are retried with exponential backoff and
full jitter (:class:`Retry`), then raised as a :class:`RemoteError` naming the redacted URL and the
byte range; the backends' own retries are turned off so that this policy is the only one.

Uploads: a file larger than its :func:`part_size` goes up in parts. On ``s3://`` gpuload runs the
multipart upload itself through botocore's API (s3fs's client; beside obstore, botocore's own where
it is installed, as obstore has no API for parts): each part is retried on its own, a part that fails
for good aborts the upload, :meth:`Store.uploads` lists the unfinished ones a killed run left, and
:meth:`Store.put` can resume one, keeping the parts whose size and MD5 match. Elsewhere (``gs://``,
``az://``, or obstore without botocore) obstore cuts the parts at that size and the file is retried whole. No message, manifest or log carries a secret: :func:`redact` removes a URL's query
string (a presigned URL's signature) and its ``user:password@``.

Nothing here imports fsspec, s3fs or obstore until a store is opened.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from ..errors import ObjectChangedError, RemoteError, UsageError

__all__ = [
    "ObjectChangedError",
    "ObjectInfo",
    "RemoteError",
    "Retry",
    "Store",
    "Upload",
    "is_url",
    "join_url",
    "open_store",
    "part_size",
    "redact",
]

_T = TypeVar("_T")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A URL inside any text: scheme, optional userinfo, the rest up to a space or quote; its query apart.
_URL_IN_TEXT = re.compile(
    r"""([A-Za-z][A-Za-z0-9+.-]*://)([^\s/?#@'"<>]*@)?([^\s?#'"<>]*)(\?[^\s#'"<>]*)?(#[^\s'"<>]*)?"""
)
OBSTORE_SCHEMES = ("s3", "gs", "az", "abfs", "abfss")
# What S3, GCS and Azure answer for a bucket (container) that does not exist, in any of the backends' texts.
_MISSING_BUCKET = re.compile(r"NoSuchBucket|ContainerNotFound|The specified bucket does not exist")
_MAKE_BUCKET = {
    "s3": "aws s3 mb s3://{bucket}",
    "gs": "gcloud storage buckets create gs://{bucket}",
    "az": "az storage container create --name {bucket}",
}
BACKENDS = ("auto", "obstore", "fsspec")


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path.

    Example:
        >>> is_url("s3://bucket/photos.jpeg"), is_url("photos.jpeg"), is_url(Path("/data/x"))
        (True, False, False)
    """
    return isinstance(path, str) and _SCHEME.match(path) is not None


def redact(text: str) -> str:
    """``text`` with every URL's query string, fragment and ``user:password@`` replaced by ``<redacted>``.

    A presigned URL's signature lives in its query string (some tools put tokens in the fragment)
    and basic-auth credentials in its userinfo: none may reach a message, a log or a manifest.

    Example:
        >>> redact("GET https://me:secret@host/a.bin?X-Amz-Signature=abc failed")
        'GET https://<redacted>@host/a.bin?<redacted> failed'
        >>> redact("https://host/a.bin#token=abc"), redact("s3://bucket/photos.jpeg")
        ('https://host/a.bin#<redacted>', 's3://bucket/photos.jpeg')
    """

    def one(match: re.Match) -> str:
        scheme, userinfo, rest, query, fragment = match.groups()
        return (
            scheme
            + ("<redacted>@" if userinfo else "")
            + rest
            + ("?<redacted>" if query else "")
            + ("#<redacted>" if fragment else "")
        )

    return _URL_IN_TEXT.sub(one, text)


def join_url(root: str, name: str) -> str:
    """``root/name`` for a dataset folder URL and a relative path in it (a query string stays at the end).

    Example:
        >>> join_url("s3://bucket/photos.jpeg/", "data.memmap")
        's3://bucket/photos.jpeg/data.memmap'
        >>> join_url("https://host/d?sig=1", "meta.json")
        'https://host/d/meta.json?sig=1'
    """
    base, sep, query = root.partition("?")
    return f"{base.rstrip('/')}/{name}" + (sep + query if sep else "")


@dataclass(frozen=True)
class ObjectInfo:
    """What identifies one version of an object: its size and, where the backend gives one, its ETag.

    Attributes:
        size: bytes.
        etag: the ETag (S3, GCS, Azure, most HTTP servers), or another version stamp the backend
            gives (a local file's modification time); ``None`` where there is none.
    """

    size: int
    etag: str | None = None

    def key(self) -> str:
        """A stable string for this version (for cache namespaces)."""
        return f"{self.size}:{self.etag or ''}"


# Multipart uploads (S3, and GCS's XML API, which has the same limits): at most MAX_PARTS parts of
# 5 MiB (the last one excepted) to MAX_PART bytes, an object of at most MAX_OBJECT bytes.
MAX_PARTS = 10_000
MIN_PART = 8 * 2**20  # above S3's 5 MiB: fewer requests for small objects, and the size boto3 starts parts at
MAX_PART = 5 * 2**30
MAX_OBJECT = 5 * 2**40
_BYTES_IN_FLIGHT = 512 * 2**20  # parts held in memory at once by one upload (at most 8 parts)


def part_size(size: int) -> int:
    """The bytes per part of an upload of ``size`` bytes: at least :data:`MIN_PART`, and enough to cut
    it into at most 90 % of :data:`MAX_PARTS` parts (a margin below the limit). An object of ``size``
    bytes or less goes up in one request.

    Example:
        >>> part_size(150 * 10**9), -(-150 * 10**9 // part_size(150 * 10**9))  # 150 GB: 9,000 parts of 16.7 MB
        (16666667, 9000)
        >>> part_size(10**6) == MIN_PART, part_size(MAX_OBJECT) // 2**20  # 5 TiB: 9,000 parts of 582 MiB
        (True, 582)
    """
    return max(MIN_PART, -(-size // (MAX_PARTS * 9 // 10)))


@dataclass(frozen=True)
class Upload:
    """A multipart upload under a store's folder that was started and neither completed nor aborted
    (a push that failed or was killed): its parts are stored, hidden, and cost storage until then.

    Attributes:
        name: the object it would make, relative to the folder.
        upload_id: the backend's id of it.
        initiated: when it started, where the backend says.
    """

    name: str
    upload_id: str
    initiated: datetime | None = None


@dataclass(frozen=True)
class Retry:
    """How failed requests are retried: exponential backoff with full jitter, a bounded number of times.

    Attempt ``n`` (from 0) that fails with a transient error (connection reset, timeout, HTTP 5xx or
    429, a short read) waits a random time in ``[0, min(max_delay, base_delay * 2**n))`` before the
    next; after ``attempts`` attempts the error is raised. ``timeout`` bounds each request's connect
    and each wait for its next bytes, ``deadline`` its whole time, body included (a server that
    trickles bytes is cut off there and the request retried), in seconds.

    Example:
        >>> policy = Retry(attempts=3, base_delay=0.5, max_delay=1.0)
        >>> [bound for bound in policy.bounds()]
        [0.5, 1.0]
    """

    attempts: int = 6
    base_delay: float = 0.1
    max_delay: float = 5.0
    timeout: float = 60.0
    deadline: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise UsageError(f"Retry.attempts must be a positive integer, got {self.attempts!r}")
        if not (self.base_delay >= 0 and self.max_delay >= 0 and self.timeout > 0 and self.deadline > 0):
            raise UsageError(
                f"Retry delays must be >= 0, timeout and deadline > 0, got base_delay={self.base_delay}, "
                f"max_delay={self.max_delay}, timeout={self.timeout}, deadline={self.deadline}"
            )

    def bounds(self) -> Iterator[float]:
        """The upper bound of each wait between attempts (``attempts - 1`` of them)."""
        for attempt in range(self.attempts - 1):
            yield min(self.max_delay, self.base_delay * 2**attempt)


class _Transient(Exception):
    """A failure worth retrying (reset, timeout, 5xx, 429, short read); its text is already redacted."""


class _NoCredentials(_Transient):
    """The instance metadata service did not answer: no key, profile or role was found, or (on a cloud
    instance) it was slow for a moment; retried like any transient failure, then said as what it is."""


class Store:
    """The objects under one folder URL: size and version, ranged reads, listing, uploads, deletes.

    Names are paths relative to the folder (``"data.memmap"``). Reads are checked and retried (see
    the module's docstring); :meth:`put`, :meth:`delete` and :meth:`list` are retried the same way.
    A store may be used from many threads at once.

    Attributes:
        url: the folder URL as given (it may hold secrets: show :attr:`display` instead).
        display: the URL, redacted, for messages.
        backend: ``"obstore"`` or ``"fsspec"``.
        retry: the retry policy.
    """

    backend = ""

    def __init__(self, url: str, retry: Retry, options: dict | None = None) -> None:
        self.url = url
        self._options = dict(options or {})
        self.display = redact(url)
        self.retry = retry

    # -- what a backend provides: one attempt each; transient failures raise _Transient --------------
    def _info(self, name: str) -> ObjectInfo:
        raise NotImplementedError

    def _read(self, name: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        raise NotImplementedError

    def _list(self) -> dict[str, ObjectInfo]:
        raise NotImplementedError

    def _put(self, name: str, local: Path, part: int) -> None:
        """Upload ``local`` whole (in parts of ``part`` bytes where the backend cuts it itself)."""
        raise NotImplementedError

    def _delete(self, name: str) -> None:
        raise NotImplementedError

    def _s3(self) -> Callable[..., dict] | None:
        """The S3 API of this store, as ``call(operation, **arguments) -> answer`` (botocore's names
        and shapes, one attempt, errors classified), or ``None`` where there is none to use: then
        :meth:`put` uploads through :meth:`_put`."""
        return None

    def _s3_key(self, name: str) -> tuple[str, str]:
        """``(bucket, key)`` of object ``name`` (``name=""``: the folder's prefix, ending in ``/``)."""
        bucket, _, prefix = self.url.split("://", 1)[1].split("?", 1)[0].partition("/")
        prefix = prefix.strip("/")
        return bucket, f"{prefix}/{name}" if prefix else name

    # -- the interface ---------------------------------------------------------------------------------
    def object_url(self, name: str) -> str:
        """The redacted URL of object ``name``, for messages."""
        return join_url(self.display, name)

    def info(self, name: str) -> ObjectInfo:
        """Size and version of object ``name``.

        Raises:
            FileNotFoundError: there is no such object.
            RemoteError: the request failed (after retries).
        """
        return self._retrying(lambda: self._info(name), f"HEAD {self.object_url(name)}")

    def read(
        self,
        name: str,
        start: int,
        length: int,
        expect: ObjectInfo | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> bytes:
        """Exactly ``length`` bytes of object ``name`` from ``start``, retried on transient failures.

        Args:
            expect: the version seen at open; a read of another version raises (where the backend
                can tell, see the module's docstring).
            cancel: once set, no retry is made (a wait for one ends at once): the read raises.

        Raises:
            ObjectChangedError: the object is no longer ``expect``.
            FileNotFoundError: the object is gone.
            RemoteError: the read failed after the retries, naming the URL and the byte range.
        """
        if length <= 0:
            return b""
        if expect is not None and start + length > expect.size:
            raise RemoteError(
                f"{self.object_url(name)}: bytes {start}-{start + length - 1} lie beyond its {expect.size:,} bytes"
            )
        what = f"GET {self.object_url(name)} bytes {start}-{start + length - 1}"
        try:
            return self._retrying(lambda: self._checked_read(name, start, length, expect), what, cancel)
        except ObjectChangedError:
            seen = f"ETag {expect.etag}" if expect is not None and expect.etag else "the version seen"
            raise ObjectChangedError(
                f"{self.object_url(name)} changed since it was opened ({seen} then): its bytes would mix two "
                "versions, so the reads stop; open the dataset again to read the new version (a running job: "
                "restart it from its checkpoint), and push changed data to a new URL"
            ) from None

    def read_all(self, name: str, expect: ObjectInfo | None = None) -> bytes:
        """The whole object ``name`` (for the manifest and the index arrays)."""
        expect = expect or self.info(name)
        return self.read(name, 0, expect.size, expect)

    def list(self) -> dict[str, ObjectInfo]:
        """Every object under the folder (recursively), by relative name; empty where there is none."""
        return self._retrying(self._list, f"LIST {self.display}")

    def put(self, name: str, local: str | os.PathLike, *, resume: Upload | None = None) -> ObjectInfo:
        """Upload the local file ``local`` as object ``name`` (replacing it); returns what is stored.

        A file larger than its :func:`part_size` goes up in parts where the store has an S3 API
        (``s3://``): each part retried on its own, several in flight, and the upload aborted if a part
        fails for good (a ``KeyboardInterrupt`` or a kill leaves it, for ``resume``). Elsewhere the
        backend cuts it in parts of that size itself (obstore) and the file is retried whole.

        Args:
            resume: an unfinished upload of this object (:meth:`uploads`): its parts whose size and
                MD5 match the file's are kept, the others uploaded.

        Raises:
            UsageError: the file is larger than an S3 or GCS object may be (:data:`MAX_OBJECT`).
            RemoteError: an upload failed after its retries.
        """
        local = Path(local)
        size = local.stat().st_size
        if size > MAX_OBJECT and self.url.split("://", 1)[0] in ("s3", "s3a", "gs"):
            raise UsageError(
                f"{local} has {size:,} bytes, more than an object of {self.display} may hold ({MAX_OBJECT:,}); "
                "split the dataset"
            )
        part = part_size(size)
        api = self._s3()
        if api is not None and size > part:
            _Parts(self, api, name, local, size, part).upload(resume)
        else:
            self._retrying(lambda: self._put(name, local, part), f"PUT {self.object_url(name)}")
        return self.info(name)

    def uploads(self) -> list[Upload]:
        """The multipart uploads under the folder that were started and neither completed nor aborted
        (``[]`` where the store has no S3 API to ask)."""
        api = self._s3()
        if api is None:
            return []
        bucket, prefix = self._s3_key("")
        found, after = [], {}
        while True:
            page = self._retrying(
                lambda after=after: api("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **after),
                f"LIST {self.display} (unfinished uploads)",
            )
            found += [
                Upload(upload["Key"][len(prefix) :], upload["UploadId"], upload.get("Initiated"))
                for upload in page.get("Uploads", [])
            ]
            if not page.get("IsTruncated"):
                return found
            after = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def abort(self, upload: Upload) -> None:
        """Abort an unfinished upload: its parts are removed; one already gone is fine."""
        api = self._s3()
        bucket, key = self._s3_key(upload.name)
        try:
            self._retrying(
                lambda: api("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id),
                f"DELETE {self.object_url(upload.name)} (unfinished upload)",
            )
        except FileNotFoundError:
            pass

    def delete(self, name: str) -> None:
        """Delete object ``name``; an object already gone is fine."""
        self._retrying(lambda: self._delete(name), f"DELETE {self.object_url(name)}")

    def _checked_read(self, name: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        data = self._read(name, start, length, expect)
        if len(data) < length:
            raise _Transient(f"short read: {len(data):,} of {length:,} bytes")
        if len(data) > length:  # a server that ignores Range sends the whole object: retrying will not help
            raise RemoteError(
                f"{self.object_url(name)}: asked for bytes {start}-{start + length - 1} and got {len(data):,} bytes; "
                "the server does not honour HTTP Range requests, which gpuload needs"
            )
        return bytes(data)

    def _retrying(self, call: Callable[[], _T], what: str, cancel: threading.Event | None = None) -> _T:
        bounds = list(self.retry.bounds())
        for attempt in range(self.retry.attempts):
            try:
                return call()
            except FileNotFoundError:  # the backends' texts may hold a URL with its query: ours instead
                raise FileNotFoundError(f"{what}: no such object") from None
            except _Transient as error:
                if attempt == len(bounds) and isinstance(error, _NoCredentials):
                    raise RemoteError(
                        f"{what}: no credentials found ({error}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
                        "AWS_PROFILE for s3://, GOOGLE_APPLICATION_CREDENTIALS for gs://, or pass them in storage_options"
                    ) from None
                if attempt == len(bounds):
                    raise RemoteError(
                        f"{what} failed {self.retry.attempts} times, last: {error}; check the network and the "
                        "server, then run again"
                    ) from None
                pause = random.uniform(0, bounds[attempt])
                if cancel is None:
                    time.sleep(pause)
                elif cancel.wait(pause):
                    raise RemoteError(f"{what} stopped: the file was closed (last: {error})") from None
        raise AssertionError("unreachable")

    def _run(self, function: Callable[[], _T]) -> _T:
        """``function()`` with the errors of fsspec's filesystems and of the HTTP and S3 clients (aiohttp,
        botocore) as ours: transient ones :class:`_Transient`, the rest final, all redacted."""
        try:
            return function()
        except (RemoteError, _Transient):
            raise
        except FileNotFoundError as error:  # s3fs's text for a missing bucket
            if _MISSING_BUCKET.search(str(error)):
                raise self._no_such_bucket() from None
            raise
        except PermissionError as error:
            raise RemoteError(f"{self.display}: access denied ({_first_line(error)}); check the credentials") from None
        except (ConnectionError, TimeoutError, asyncio.TimeoutError) as error:
            raise _Transient(_first_line(error) or type(error).__name__) from None
        except OSError as error:
            if error.errno in _TRANSIENT_ERRNOS:  # s3fs's translation of a 503 or a throttle (EBUSY)
                raise _Transient(_first_line(error)) from None
            raise _classify_client(error) from None
        except Exception as error:  # the async clients' own errors (aiohttp, botocore): classify by status
            response = getattr(error, "response", None)
            if isinstance(response, dict) and _MISSING_BUCKET.search(response.get("Error", {}).get("Code", "")):
                raise self._no_such_bucket() from None
            raise _classify_client(error) from None

    def _no_such_bucket(self) -> RemoteError:
        """The one line for a bucket (or Azure container) that does not exist, naming how to make one."""
        scheme, _, rest = self.display.partition("://")
        bucket = rest.split("/", 1)[0].split("@", 1)[0]
        make = _MAKE_BUCKET.get(scheme, "with your provider's console or command line").format(bucket=bucket)
        return RemoteError(
            f"no such bucket: {bucket} at {self.display}; create it first ({make}), or check the bucket's name and "
            "the endpoint"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display!r})"

    def __reduce__(self):
        """Pickled as what opens it again (for DataLoader workers): the URL, backend, policy and options."""
        return _reopen, (self.url, self.backend, self.retry, self._options)


class _Parts:
    """One multipart upload of a local file through a store's S3 API (see :meth:`Store.put`)."""

    def __init__(self, store: Store, api: Callable[..., dict], name: str, local: Path, size: int, part: int) -> None:
        self.store, self.api, self.name, self.local, self.size, self.part = store, api, name, local, size, part
        self.bucket, self.key = store._s3_key(name)
        self.url = store.object_url(name)
        self.count = -(-size // part)

    def upload(self, resume: Upload | None) -> None:
        done = self._kept(resume) if resume is not None else None
        if done is None:
            answer = self._retrying(lambda: self.api("create_multipart_upload", Bucket=self.bucket, Key=self.key))
            upload_id, done = answer["UploadId"], {}
        else:
            upload_id = resume.upload_id
        try:
            todo = [number for number in range(1, self.count + 1) if number not in done]
            workers = max(1, min(8, _BYTES_IN_FLIGHT // self.part, len(todo)))
            with ThreadPoolExecutor(workers, thread_name_prefix="gpuload-remote-upload") as pool:
                futures = {pool.submit(self._put_part, upload_id, number): number for number in todo}
                try:
                    for future in as_completed(futures):
                        done[futures[future]] = future.result()
                finally:
                    for future in futures:
                        future.cancel()
            parts = [{"PartNumber": number, "ETag": done[number]} for number in range(1, self.count + 1)]
            self._retrying(
                lambda: self.api(
                    "complete_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
                f"(completing its {self.count} parts)",
            )
        except Exception as error:  # a part failed for good: its parts would cost storage, hidden
            try:
                self.store.abort(Upload(self.name, upload_id))
            except Exception as again:  # noqa: BLE001 - the first error is the one to tell
                raise RemoteError(f"{error}; its unfinished upload could not be aborted either ({again})") from None
            raise

    def _kept(self, resume: Upload) -> dict[int, str] | None:
        """The parts of an unfinished upload that hold this file's bytes (size and MD5), by number; ``None``
        when the upload is gone."""
        found, after = [], {}
        while True:
            try:
                page = self._retrying(
                    lambda after=after: self.api(
                        "list_parts", Bucket=self.bucket, Key=self.key, UploadId=resume.upload_id, **after
                    ),
                    "(listing the parts of its unfinished upload)",
                )
            except FileNotFoundError:
                return None
            found += page.get("Parts", [])
            if not page.get("IsTruncated"):
                break
            after = {"PartNumberMarker": page["NextPartNumberMarker"]}
        kept = {}
        for part in found:
            number, etag = part["PartNumber"], part["ETag"]
            if number <= self.count and part["Size"] == self._length(number):
                if etag.strip('"') == hashlib.md5(self._read(number)).hexdigest():
                    kept[number] = etag
        return kept

    def _put_part(self, upload_id: str, number: int) -> str:
        data = self._read(number)
        digest = base64.b64encode(hashlib.md5(data).digest()).decode()  # the server checks the bytes it got
        answer = self._retrying(
            lambda: self.api(
                "upload_part",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=digest,
            ),
            f"part {number} of {self.count}",
        )
        return answer["ETag"]

    def _length(self, number: int) -> int:
        return min(self.part, self.size - (number - 1) * self.part)

    def _read(self, number: int) -> bytes:
        with open(self.local, "rb") as file:
            data = os.pread(file.fileno(), self._length(number), (number - 1) * self.part)
        if len(data) != self._length(number):
            raise UsageError(f"{self.local} changed while it was uploaded (it is shorter now); push it again")
        return data

    def _retrying(self, call: Callable[[], _T], what: str = "") -> _T:
        return self.store._retrying(call, f"PUT {self.url} {what}".rstrip())


def open_store(
    url: str, *, backend: str = "auto", retry: Retry | None = None, storage_options: dict | None = None
) -> Store:
    """The :class:`Store` of the folder at ``url``.

    Args:
        url: ``s3://bucket/path``, ``gs://...``, ``az://...``, ``https://...``, ``file:///...`` or any
            other URL fsspec knows. Credentials come from each backend's usual places (environment
            variables, profiles, instance metadata); never put them in the URL where you can avoid it.
        backend: ``"auto"`` (obstore for s3/gs/az when installed, else fsspec), ``"obstore"`` or
            ``"fsspec"``; the ``GPULOAD_REMOTE_BACKEND`` environment variable sets the default.
        retry: the retry policy (default :class:`Retry`).
        storage_options: keyword arguments for the fsspec filesystem, or the obstore config keys
            (``endpoint``, ``region``...).

    Raises:
        UsageError: not a URL, an unknown backend, a scheme the chosen backend cannot open, or the
            backend's package is missing (naming the pip extra).

    Example:
        >>> store = open_store("memory://example/photos.jpeg")
        >>> store.backend, store.display
        ('fsspec', 'memory://example/photos.jpeg')
    """
    if not is_url(url):
        raise UsageError(f"expected a URL such as s3://bucket/path or https://host/path, got {url!r}")
    backend = os.environ.get("GPULOAD_REMOTE_BACKEND", backend) if backend == "auto" else backend
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    retry = retry or Retry()
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()  # schemes are case-insensitive (RFC 3986): S3:// is s3://
    url = f"{scheme}://{rest}"
    if scheme in ("file", "memory") and ("?" in rest or "#" in rest):
        raise UsageError(
            f"a {scheme}:// URL names a folder and takes no query string or fragment, got {redact(url)}; "
            "remove what follows ? or #"
        )
    if scheme in ("http", "https") and "#" in rest:  # never sent to the server: the objects' names would follow it
        raise UsageError(f"an {scheme}:// dataset URL takes no fragment, got {redact(url)}; remove what follows #")
    if scheme == "file":  # RFC 8089: file:///path, or file://localhost/path on this machine
        host, _, path = rest.partition("/")
        if host not in ("", "localhost"):
            raise UsageError(f"file:// URLs name this machine's files (file:///path), got {redact(url)}")
        url = f"file:///{path}"
    if backend == "obstore" or (backend == "auto" and scheme in OBSTORE_SCHEMES and _installed("obstore")):
        if scheme not in OBSTORE_SCHEMES:
            raise UsageError(f"the obstore backend opens {', '.join(OBSTORE_SCHEMES)} URLs, not {scheme}://")
        return _ObstoreStore(url, retry, storage_options or {})
    return _FsspecStore(url, retry, storage_options or {})


def _reopen(url: str, backend: str, retry: Retry, options: dict) -> Store:
    return open_store(url, backend=backend, retry=retry, storage_options=options)


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _missing(package: str, url: str) -> UsageError:
    return UsageError(
        f"reading {redact(url)} needs the Python package {package!r}; install it with pip install 'gpuload[cloud]' "
        f"(or pip install {package})"
    )


# ------------------------------------------------------------------------------------------------------
# obstore: s3://, gs://, az://
# ------------------------------------------------------------------------------------------------------
_STATUS = re.compile(r"status(?: code)?:? (\d{3})", re.IGNORECASE)


class _ObstoreStore(Store):
    backend = "obstore"

    def __init__(self, url: str, retry: Retry, options: dict) -> None:
        super().__init__(url, retry, options)
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise _missing("obstore", url) from None
        self._obstore = obstore
        self._client, self._client_lock = None, threading.Lock()
        from datetime import timedelta

        client = {
            "timeout": timedelta(seconds=retry.deadline),  # reqwest's: the whole request, body included
            "connect_timeout": timedelta(seconds=retry.timeout),
            "read_timeout": timedelta(seconds=retry.timeout),
        }
        endpoint = options.get("endpoint") or _aws_endpoint(url)
        if endpoint and endpoint.startswith("http://"):
            client["allow_http"] = True
        config = dict(options)
        if endpoint and url.startswith("s3://"):
            config.setdefault("endpoint", endpoint)
        root = url.split("?", 1)[0].rstrip("/")
        extra = {}
        provider = _aws_profiles() if url.startswith("s3://") else None
        if provider is not None:
            extra["credential_provider"] = provider
        try:
            self._store = from_url(
                root, config=config or None, client_options=client, retry_config={"max_retries": 0}, **extra
            )
        except Exception as error:  # obstore raises its own types (and ValueError) for bad URLs or config
            raise UsageError(f"cannot open {self.display}: {redact(str(error))}") from None

    def _call(self, function, *args, **kwargs):
        exceptions = self._obstore.exceptions
        try:
            return function(*args, **kwargs)
        except (FileNotFoundError, exceptions.NotFoundError, exceptions.GenericError) as error:
            if _MISSING_BUCKET.search(str(error)):  # the XML error's code, past the text's first line
                raise self._no_such_bucket() from None
            if isinstance(error, exceptions.GenericError):
                raise _classify(error) from None
            raise FileNotFoundError(f"{self.display}: no such object ({args[1] if len(args) > 1 else ''})") from None
        except exceptions.PreconditionError:
            raise ObjectChangedError("the object changed since it was opened") from None
        except (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError) as error:
            raise RemoteError(f"{self.display}: access denied ({_first_line(error)}); check the credentials") from None
        except (ConnectionError, TimeoutError) as error:
            raise _Transient(_first_line(error)) from None
        except exceptions.BaseError as error:  # the rest of obstore's errors: final, and redacted
            raise RemoteError(_first_line(error)) from None

    def _info(self, name: str) -> ObjectInfo:
        meta = self._call(self._obstore.head, self._store, name)
        return ObjectInfo(size=meta["size"], etag=meta.get("e_tag"))

    def _read(self, name: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        options = {"range": (start, start + length)}
        if expect is not None and expect.etag:
            options["if_match"] = expect.etag
        try:
            result = self._call(self._obstore.get, self._store, name, options=options)
        except RemoteError as error:
            if _NO_RANGE not in str(error):
                raise
            raise RemoteError(
                f"{self.object_url(name)}: asked for bytes {start}-{start + length - 1} and got the whole object; "
                "the server does not honour HTTP Range requests, which gpuload needs"
            ) from None
        return self._call(lambda: bytes(result.bytes()))

    def _list(self) -> dict[str, ObjectInfo]:
        found = {}
        for chunk in self._call(lambda: list(self._obstore.list(self._store))):
            for meta in chunk:
                found[meta["path"]] = ObjectInfo(size=meta["size"], etag=meta.get("e_tag"))
        return found

    def _put(self, name: str, local: Path, part: int) -> None:
        concurrency = max(1, min(8, _BYTES_IN_FLIGHT // part))
        self._call(self._obstore.put, self._store, name, local, chunk_size=part, max_concurrency=concurrency)

    def _s3(self) -> Callable[..., dict] | None:
        """botocore's S3 client, where it is installed (boto3 or s3fs bring it): obstore offers no API to
        upload, list or abort the parts of a multipart upload itself."""
        if not self.url.startswith("s3://") or not _installed("botocore"):
            return None
        with self._client_lock:
            if self._client is None:
                self._client = self._botocore_client()
        client = self._client
        return lambda operation, **arguments: self._run(lambda: getattr(client, operation)(**arguments))

    def _botocore_client(self):
        """A botocore S3 client of the same endpoint, region and keys as this store (botocore's own
        credential chain where none were given), with no retries of its own."""
        import botocore.session
        from botocore.config import Config

        options = {key.lower().removeprefix("aws_"): value for key, value in self._options.items()}
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=self.retry.timeout,
            read_timeout=self.retry.timeout,
            max_pool_connections=16,
        )
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=options.get("endpoint") or options.get("endpoint_url") or _aws_endpoint(self.url),
            region_name=options.get("region") or options.get("default_region"),
            aws_access_key_id=options.get("access_key_id"),
            aws_secret_access_key=options.get("secret_access_key"),
            aws_session_token=options.get("session_token") or options.get("token"),
            config=config,
        )

    def _delete(self, name: str) -> None:
        self._call(self._obstore.delete, self._store, name)


def _aws_profiles():
    """boto3's credential chain (``~/.aws`` profiles, ``AWS_PROFILE``, SSO) for obstore, which reads only
    the environment and instance metadata itself; ``None`` when the keys are in the environment,
    boto3 is not installed or finds none (obstore's own chain then answers for itself)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or not _installed("boto3"):
        return None
    from obstore.auth.boto3 import Boto3CredentialProvider

    try:
        return Boto3CredentialProvider()
    except ValueError as error:  # "Received None from session.get_credentials": no profile, no SSO
        if "credentials" not in str(error):
            raise
        return None


def _aws_endpoint(url: str) -> str | None:
    if not url.startswith("s3://"):
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


_METADATA = "169.254.169.254"  # the cloud instance metadata service (AWS, GCP, Azure)
_NO_RANGE = "non-partial response when range requested"


def _classify(error: BaseException) -> BaseException:
    """A backend's error as :class:`_Transient` (5xx, 429, 408, no status: the connection) or :class:`RemoteError`."""
    text = _first_line(error)
    if _METADATA in text:  # no key, profile or role: obstore fell back to the instance metadata service
        return _NoCredentials(text)
    if _NO_RANGE in text:  # object_store's check of a ranged GET's answer: retrying will not help
        return RemoteError(text)
    status = _STATUS.search(str(error))
    if status is None or int(status[1]) >= 500 or int(status[1]) in (408, 429):
        return _Transient(text)
    return RemoteError(text)


def _first_line(error: BaseException) -> str:
    """The first line of ``error``'s text, redacted, then cut at 300 characters (in this order: a URL
    cut inside ``user:password@`` no longer looks like one and would keep the password's start)."""
    text = str(error).strip() or type(error).__name__
    first = text.splitlines()[0]
    xml = _XML_ERROR.search(text)
    if xml is not None and "<?xml" in first:  # obstore's text: the server's XML error, often cut after its first line
        first = first.partition("<?xml")[0] + f"{xml['code']}: {xml['message']}"
    return redact(first)[:300]


_XML_ERROR = re.compile(r"<Code>(?P<code>[^<]*)</Code>\s*<Message>(?P<message>[^<]*)</Message>")


# ------------------------------------------------------------------------------------------------------
# fsspec: any URL it knows (https://, file://, memory://, and s3fs/gcsfs/adlfs without obstore)
# ------------------------------------------------------------------------------------------------------
class _FsspecStore(Store):
    backend = "fsspec"

    def __init__(self, url: str, retry: Retry, options: dict) -> None:
        super().__init__(url, retry, options)
        import fsspec

        scheme = url.split("://", 1)[0].lower()
        options = {"skip_instance_cache": True, **options}  # a cached instance keeps an old endpoint or loop
        if scheme in ("http", "https"):
            import aiohttp

            timeout = aiohttp.ClientTimeout(total=retry.deadline, connect=retry.timeout, sock_read=retry.timeout)
            options.setdefault("client_kwargs", {}).setdefault("timeout", timeout)
        elif scheme in ("s3", "s3a"):
            config = options.setdefault("config_kwargs", {})
            config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})  # botocore's: none
            config.setdefault("connect_timeout", retry.timeout)
            config.setdefault("read_timeout", retry.timeout)
        try:
            self.fs, root = fsspec.core.url_to_fs(
                url.split("?", 1)[0] if scheme in ("s3", "gs", "az") else url, **options
            )
        except ImportError as error:
            if getattr(error, "name", None):
                raise _missing(error.name, url) from None
            raise UsageError(  # fsspec's own message names the package its filesystem needs
                f"reading {self.display} needs a Python package that is missing: {_first_line(error)}"
            ) from None
        except ValueError as error:
            raise UsageError(f"cannot open {self.display}: {_first_line(error)}") from None
        except OSError as error:  # some filesystems (ftp, sftp) connect as they are made
            raise RemoteError(
                f"cannot open {self.display}: {_first_line(error) or type(error).__name__}; "
                "check the URL, the network and the server"
            ) from None
        if scheme in ("s3", "s3a"):
            self.fs.retries = 1  # s3fs's own loop: one attempt; ours retries
        self.scheme = scheme
        self._root = root.rstrip("/") if scheme not in ("http", "https") else url.split("?", 1)[0].rstrip("/")
        self._query = ("?" + url.split("?", 1)[1]) if "?" in url and scheme in ("http", "https") else ""
        self._local = type(self.fs).__name__ == "LocalFileSystem"

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}{self._query}"

    def _sync(self, request: Callable[[], Awaitable[_T]]) -> _T:
        """Run one request on fsspec's event loop, cancelled at the policy's deadline (a trickling answer
        would hold it for ever: botocore bounds only the connect and each read)."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, request, timeout=self.retry.deadline)

    def _info(self, name: str) -> ObjectInfo:
        if self.scheme in ("http", "https"):
            return self._run(lambda: self._http_info(self._path(name)))
        if self.scheme in ("s3", "s3a"):
            return self._run(lambda: self._s3_info(self._path(name)))
        info = self._run(lambda: self.fs.info(self._path(name)))
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{self.object_url(name)} is a folder, not an object")
        return ObjectInfo(size=int(info["size"]), etag=_version_stamp(info))

    def _read(self, name: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        path = self._path(name)
        if self._local:
            data = self._run(lambda: self.fs.cat_file(path, start=start, end=start + length))
            if expect is not None and self._info(name) != expect:
                raise ObjectChangedError("the file changed since it was opened")
            return data
        if self.scheme in ("http", "https"):
            return self._run(lambda: self._http_read(name, start, length, expect))
        if self.scheme in ("s3", "s3a"):
            return self._run(lambda: self._s3_read(path, start, length, expect))
        return self._run(lambda: self.fs.cat_file(path, start=start, end=start + length))

    def _http_info(self, url: str) -> ObjectInfo:
        """HEAD (or, where a server refuses it, a GET of byte 0) through fsspec's aiohttp session:
        fsspec's own ``info`` turns every failure, a 503 included, into "not found"."""

        async def head() -> ObjectInfo:
            session = await self.fs.set_session()
            async with session.head(self.fs.encode_url(url), allow_redirects=True) as response:
                if response.status in (405, 501):  # no HEAD here: ask for one byte
                    async with session.get(self.fs.encode_url(url), headers={"Range": "bytes=0-0"}) as ranged:
                        return _http_object(ranged, ranged.headers.get("Content-Range", "").rpartition("/")[2])
                return _http_object(response, response.headers.get("Content-Length"))

        return self._sync(head)

    def _http_read(self, name: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        """One ranged GET through fsspec's aiohttp session, its status, ``Content-Range`` and length
        checked before its body is read, and no more than ``length`` bytes read: a server that ignores
        ``Range`` would send the whole object (fsspec's ``cat_file`` reads it all, then checks)."""
        url = self._path(name)
        end = start + length - 1
        headers = {"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        if expect is not None and _strong_etag(expect.etag):
            headers["If-Match"] = expect.etag

        async def get() -> bytes:
            session = await self.fs.set_session()
            async with session.get(self.fs.encode_url(url), headers=headers) as response:
                if response.status == 404:
                    raise FileNotFoundError(self.object_url(name))
                if response.status == 412:
                    raise ObjectChangedError("the object changed since it was opened")
                if response.status >= 400:
                    response.raise_for_status()  # an aiohttp error with its status: classified by the caller
                ranged = response.status == 206 and _content_range(response.headers) == (start, end)
                whole = response.status == 200 and start == 0  # the whole object asked for, answered whole
                if not (ranged or whole) or response.content_length not in (None, length):
                    response.close()  # the connection is dropped with its body unread
                    size = "unknown" if response.content_length is None else f"{response.content_length:,}"
                    raise RemoteError(
                        f"{self.object_url(name)}: asked for bytes {start}-{end} and got a {response.status} answer "
                        f"of {size} bytes; the server does not honour HTTP Range requests, which gpuload needs"
                    )
                return await response.content.readexactly(length)

        return self._sync(get)

    def _s3_info(self, path: str) -> ObjectInfo:
        """HeadObject through s3fs's client: s3fs's ``info`` turns a 503 into an errno without its status."""
        bucket, key, _ = self.fs.split_path(path)

        async def head() -> ObjectInfo:
            await self.fs.set_session()
            client = await self.fs.get_s3(bucket)
            response = await client.head_object(Bucket=bucket, Key=key)
            return ObjectInfo(size=int(response["ContentLength"]), etag=response.get("ETag"))

        return self._sync(head)

    def _s3_check_bucket(self) -> None:
        """HeadBucket: a 404 is a missing bucket (said as such), anything else is the caller's to classify."""
        bucket = self.fs.split_path(self._root)[0]

        async def head() -> None:
            await self.fs.set_session()
            client = await self.fs.get_s3(bucket)
            await client.head_bucket(Bucket=bucket)

        try:
            self._sync(head)
        except Exception as error:
            status = (getattr(error, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404:
                raise self._no_such_bucket() from None
            raise

    def _s3_read(self, path: str, start: int, length: int, expect: ObjectInfo | None) -> bytes:
        """One GET with ``If-Match`` through s3fs's aiobotocore client (s3fs's ``cat_file`` cannot send it)."""
        bucket, key, _ = self.fs.split_path(path)
        extra = {"IfMatch": expect.etag} if expect is not None and expect.etag else {}

        async def get() -> bytes:
            await self.fs.set_session()
            client = await self.fs.get_s3(bucket)
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}", **extra
            )
            try:
                if response["ContentLength"] != length:  # checked before the body is read
                    raise RemoteError(
                        f"s3://{bucket}/{key}: asked for bytes {start}-{start + length - 1} "
                        f"and got an answer of {response['ContentLength']:,} bytes; the server does not honour HTTP "
                        "Range requests, which gpuload needs"
                    )
                return await response["Body"].read()
            finally:
                response["Body"].close()

        return self._sync(get)

    def _list(self) -> dict[str, ObjectInfo]:
        if self.scheme in ("http", "https"):
            raise UsageError(f"{self.display}: an HTTP server cannot be listed or written; push to s3:// or file://")
        try:
            found = self._run(lambda: self.fs.find(self._root, detail=True))
        except FileNotFoundError:
            found = {}
        if not found and self.scheme in ("s3", "s3a"):
            self._run(self._s3_check_bucket)  # s3fs lists a missing bucket as empty
        prefix = self._root.rstrip("/") + "/"
        return {
            path[len(prefix) :]: ObjectInfo(size=int(info["size"]), etag=_version_stamp(info))
            for path, info in found.items()
            if path.startswith(prefix) and info.get("type") != "directory"
        }

    def _s3(self) -> Callable[..., dict] | None:
        """s3fs's aiobotocore client, each request cancelled at the policy's deadline."""
        if self.scheme not in ("s3", "s3a"):
            return None

        def call(operation: str, **arguments) -> dict:
            async def request() -> dict:
                await self.fs.set_session()
                client = await self.fs.get_s3(arguments["Bucket"])
                return await getattr(client, operation)(**arguments)

            return self._run(lambda: self._sync(request))

        return call

    def _put(self, name: str, local: Path, part: int) -> None:
        if self.scheme in ("http", "https"):
            raise UsageError(f"{self.display}: an HTTP server cannot be written; push to s3:// or file://")
        target = self._path(name)
        if self._local:  # a reader never sees a half-written file: a temporary name, flushed, renamed
            from ..writing.files import fsync_file, fsync_folder

            parent = Path(target).parent
            parent.mkdir(parents=True, exist_ok=True)
            temporary = parent / f".{Path(target).name}.tmp-{os.getpid()}-{threading.get_ident()}"
            try:
                self._run(lambda: self.fs.put_file(str(local), str(temporary)))
                fsync_file(temporary)
                os.replace(temporary, target)
                fsync_folder(parent)
            finally:
                if temporary.exists():
                    temporary.unlink()
            return
        self._run(lambda: self.fs.put_file(str(local), target))

    def _delete(self, name: str) -> None:
        try:
            self._run(lambda: self.fs.rm_file(self._path(name)))
        except FileNotFoundError:
            pass


def _http_object(response, size: str | None) -> ObjectInfo:
    """An HTTP answer to a HEAD or a one-byte GET as :class:`ObjectInfo`, or the error it means."""
    if response.status == 404:
        raise FileNotFoundError(redact(str(response.url)))
    if response.status >= 400:
        response.raise_for_status()  # an aiohttp error with its status: classified by the caller
    if size is None or not size.isdigit():
        raise RemoteError(
            f"{redact(str(response.url))} does not say its size (no Content-Length); gpuload needs a server that does"
        )
    stamp = response.headers.get("ETag")
    if stamp is None and response.headers.get("Last-Modified"):
        stamp = f"modified:{response.headers['Last-Modified']}"
    return ObjectInfo(size=int(size), etag=stamp)


def _content_range(headers) -> tuple[int, int] | None:
    """``(first, last)`` of a ``Content-Range: bytes first-last/size`` header, or ``None``.

    Example:
        >>> _content_range({"Content-Range": "bytes 10-14/300"}), _content_range({})
        ((10, 14), None)
    """
    found = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", headers.get("Content-Range", "").strip())
    return (int(found[1]), int(found[2])) if found else None


def _strong_etag(etag: str | None) -> bool:
    """Whether ``etag`` can go in an ``If-Match`` header: a server's strong ETag (a weak one, ``W/"..."``,
    never matches there, and the stamps made of modification times are ours).

    Example:
        >>> _strong_etag('"abc"'), _strong_etag('W/"abc"'), _strong_etag("modified:Tue, 1 Jan 2026"), _strong_etag(None)
        (True, False, False, False)
    """
    return bool(etag) and not etag.startswith(("W/", "mtime:", "modified:"))


_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE}


def _version_stamp(info: dict) -> str | None:
    """The ETag (S3, HTTP, GCS, Azure) or, for a local file, its modification time: what changes with it."""
    for key in ("ETag", "etag", "e_tag", "md5Hash", "generation"):
        if info.get(key):
            return str(info[key])
    if info.get("mtime") is not None:
        return f"mtime:{info['mtime']}"
    if info.get("Last-Modified"):
        return f"modified:{info['Last-Modified']}"
    return None


def _classify_client(error: BaseException) -> BaseException:
    """aiohttp's and botocore's errors: 412 is a changed object, 404 a missing one, 5xx/429/408 and
    transport errors are transient, anything else is final."""
    status = getattr(error, "status", None)
    response = getattr(error, "response", None)
    code = ""
    if status is None and isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response.get("Error", {}).get("Code", "")
    text = _first_line(error)
    if status == 412 or code in ("PreconditionFailed",):
        return ObjectChangedError("the object changed since it was opened")
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "404"):
        return FileNotFoundError(text)
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return RemoteError(f"access denied ({text}); check the credentials")
    if status is not None:
        return _Transient(text) if status >= 500 or status in (408, 429) or code == "SlowDown" else RemoteError(text)
    names = {klass.__name__ for klass in type(error).__mro__}
    transport = {
        "ClientConnectionError", "ClientPayloadError", "ServerDisconnectedError", "ServerTimeoutError",
        "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
        "ResponseStreamingError", "IncompleteReadError", "ContentLengthError", "ClientOSError",
    }  # fmt: skip
    if names & transport:
        return _Transient(text)
    return RemoteError(text)
