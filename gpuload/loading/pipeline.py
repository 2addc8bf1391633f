"""A loader's epoch at work: producer threads gather batches into a ring of reused host buffers (pinned
for CUDA) and copy them to the device on their own side streams; the consumer takes them in order.

The stream protocol, each step a function of this module (the CUDA tests' deletion check removes each
in turn): a producer waits on the host until the last copy out of its buffer has read it
(:func:`_host_waits`); the consumer's stream waits for the copy before using the batch
(:func:`_stream_waits`) and records the batch's tensors on it (:func:`_record_on`), so that their memory
is not reused while it runs; a CUDA-graph transform runs on the consumer's side (:func:`_on_consumer_side`).
"""

from __future__ import annotations

import atexit
import hashlib
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..format.dataset import MemmapImageDataset
from ..machine import default_workers, limit_torch_threads
from .calls import stop_iteration_as_error, takes_generator
from .crop import CenterCropDecode, RandomResizedCropDecode, decode_batch
from .fields import FieldGather, tensors, to_device
from .prefetch import BlockPrefetchers

if TYPE_CHECKING:
    from .loader import DataLoader, Position

__all__ = [
    "BatchTransform",
    "EpochIterator",
    "Gather",
    "Ring",
    "RingPool",
    "decode_on_device",
    "index_select",
    "read_raw",
    "uses_cuda_graphs",
]

_EXIT_JOIN_S = 10  # at exit, how long to wait for each producer's last gather
_POLL_S = 0.1  # how often a waiting producer looks at the stop flag, in case no notification reached it

# The images of a batch (its dataset indices): written into the uint8 host buffer [B, 3, H, W]
# (returns None), or made on the loader's device (returns that tensor: jpeg decoded on the GPU,
# whose host buffer is None).
Gather = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor | None]


def index_select(images: torch.Tensor, channels_last: bool, indices: torch.Tensor, out: torch.Tensor) -> None:
    """A raw dataset's batch: one gather straight from the memory-mapped pixels, in the order they lie
    in (``images`` is ``[N, H, W, 3]`` when ``channels_last``, and ``out`` then a channels-last view)."""
    torch.index_select(images, 0, indices, out=out.permute(0, 2, 3, 1) if channels_last else out)


def read_raw(dataset: MemmapImageDataset, channels_last: bool, indices: torch.Tensor, out: torch.Tensor) -> None:
    """A raw dataset's batch at a URL: each image's stored bytes (read in parallel through the block
    cache, checksums checked) copied into the host buffer in the order they lie."""
    stored = (out.permute(0, 2, 3, 1) if channels_last else out).numpy()
    for row, data in enumerate(dataset.read_images(indices.tolist())):
        stored[row] = np.frombuffer(data, dtype=np.uint8).reshape(stored.shape[1:])


def decode_on_device(
    dataset: MemmapImageDataset,
    decode: RandomResizedCropDecode | CenterCropDecode,
    seed: int,
    epoch: int,
    device: torch.device,
    indices: torch.Tensor,
    out: None,
) -> torch.Tensor:
    """A jpeg batch decoded and cropped on the loader's device (``decode.gpu``), on the current stream."""
    return decode_batch(dataset, indices, decode, seed=seed, epoch=epoch, device=device)


class _HostSlot:
    """A CPU buffer of the ring, whose batches are handed to the user as they are.

    Its memory is a numpy array, and each batch is a fresh ``torch.from_numpy(array)[:count]``:
    the tensor's storage holds a reference to the array for as long as any tensor, view or numpy
    view of the batch lives, so the array's reference count tells whether the user still holds it.
    """

    def __init__(self, shape: torch.Size, batch_size: int, channels_last: bool, fields: FieldGather) -> None:
        self.shape, self.batch_size, self.channels_last, self.fields = shape, batch_size, channels_last, fields
        self._allocate()

    def _allocate(self) -> None:
        channels, *plane = self.shape
        shape = (self.batch_size, *plane, channels) if self.channels_last else (self.batch_size, *self.shape)
        self.images = np.empty(shape, dtype=np.uint8)
        self.labels = np.empty((self.batch_size,), dtype=np.int64)
        self.extra = {  # a tensor's numpy array, whose reference count tells whether a batch of it is held
            name: torch.empty((self.batch_size, *row), dtype=dtype).numpy()
            for name, (row, dtype) in self.fields.buffers.items()
        }
        self._unheld = self._references()

    def _references(self) -> tuple[int, ...]:
        return (
            sys.getrefcount(self.images),
            sys.getrefcount(self.labels),
            *(sys.getrefcount(array) for array in self.extra.values()),
        )

    def held(self) -> bool:
        """Whether a batch gathered into this buffer (or anything viewing it) is still alive."""
        return self._references() != self._unheld

    def fill(
        self,
        gather: Gather,
        fields: FieldGather,
        labels: torch.Tensor,
        indices: torch.Tensor,
        transform: Callable | None,
        stream: None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | list[str]], None]:
        if self.held():
            self._allocate()  # the user kept a batch: it keeps that memory
        count = len(indices)
        batch_images = torch.from_numpy(self.images)[:count]
        batch_images = batch_images.permute(0, 3, 1, 2) if self.channels_last else batch_images
        batch_labels = torch.from_numpy(self.labels)[:count]
        made = gather(indices, batch_images)
        batch_images = batch_images if made is None else made
        torch.index_select(labels, 0, indices, out=batch_labels)
        extra = fields.fill(indices, {name: torch.from_numpy(array)[:count] for name, array in self.extra.items()})
        return batch_images if transform is None else transform(batch_images), batch_labels, extra, None


class _PinnedSlot:
    """A pinned buffer of a CUDA ring, copied to the device on the stream of the producer that filled
    it, with the event of its last copy: it is refilled only once that copy is done. A ring for
    batches decoded on the device holds pinned labels only (``images`` is ``None``)."""

    def __init__(
        self,
        shape: torch.Size,
        batch_size: int,
        channels_last: bool,
        device: torch.device,
        images: bool,
        fields: FieldGather,
    ) -> None:
        channels, *plane = shape
        self.images: torch.Tensor | None = None
        if images and channels_last:
            self.images = torch.empty((batch_size, *plane, channels), dtype=torch.uint8, pin_memory=True)
            self.images = self.images.permute(0, 3, 1, 2)
        elif images:
            self.images = torch.empty((batch_size, *shape), dtype=torch.uint8, pin_memory=True)
        self.labels = torch.empty((batch_size,), dtype=torch.int64, pin_memory=True)
        self.fields = fields
        self.extra = {
            name: torch.empty((batch_size, *row), dtype=dtype, pin_memory=True)
            for name, (row, dtype) in fields.buffers.items()
        }
        self.device = device
        self.event: torch.cuda.Event | None = None

    def held(self) -> bool:
        return False  # the user gets device copies, never this buffer

    def fill(
        self,
        gather: Gather,
        fields: FieldGather,
        labels: torch.Tensor,
        indices: torch.Tensor,
        transform: Callable | None,
        stream: torch.cuda.Stream,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | list[str]], torch.cuda.Event]:
        if self.event is not None:
            _host_waits(self.event)  # the last copy out of this buffer has read it
        count = len(indices)
        host_images = None if self.images is None else self.images[:count]
        host_labels = self.labels[:count]
        torch.index_select(labels, 0, indices, out=host_labels)
        host_extra = fields.fill(indices, {name: buffer[:count] for name, buffer in self.extra.items()})
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            made = gather(indices, host_images)  # a batch decoded on the device is queued on this stream
            images = host_images.to(self.device, non_blocking=True) if made is None else made
            labels = host_labels.to(self.device, non_blocking=True)
            extra = to_device(host_extra, self.device)  # text stays on the host
            self.event = torch.cuda.Event(blocking=True)  # the host waits on it: block, do not spin
            self.event.record(stream)  # the copy out of the pinned buffer, for its next fill
            if transform is not None:
                images = transform(images)  # queued on the same stream: the consumer waits for it too
                done = torch.cuda.Event()
                done.record(stream)
                return images, labels, extra, done
        return images, labels, extra, self.event


# The three steps of the stream protocol, each a function of its own (the deletion check of the
# `cuda` tests replaces each with nothing and expects them to fail).


def _host_waits(event: torch.cuda.Event) -> None:
    """A producer waits until the copy out of a pinned buffer is done before refilling it."""
    event.synchronize()


def _stream_waits(stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
    """The consumer's stream waits for a batch's copy (and transform) before anything it queues."""
    stream.wait_event(event)


def _record_on(stream: torch.cuda.Stream, *tensors: torch.Tensor) -> None:
    """The caching allocator keeps a batch's memory until the consumer's stream is done with it."""
    for tensor in tensors:
        tensor.record_stream(stream)


_Slot = _HostSlot | _PinnedSlot


class Ring:
    """The host buffers of one iteration and, on CUDA, a stream per producer thread for their copies
    (one stream for all would make each batch wait for the other producers' work queued before it)."""

    def __init__(
        self,
        shape: torch.Size,
        batch_size: int,
        slots: int,
        device: torch.device,
        channels_last: bool,
        host_images: bool = True,
        fields: FieldGather | None = None,
    ) -> None:
        self.device = device
        self._streams: list[torch.cuda.Stream] = []
        fields = fields if fields is not None else FieldGather({})
        if device.type == "cuda":
            self.slots: list[_Slot] = [
                _PinnedSlot(shape, batch_size, channels_last, device, host_images, fields) for _ in range(slots)
            ]
        else:
            self.slots = [_HostSlot(shape, batch_size, channels_last, fields) for _ in range(slots)]

    def stream(self, producer: int) -> torch.cuda.Stream | None:
        """The side stream of producer ``producer`` (made once, kept with the ring); ``None`` on the CPU."""
        if self.device.type != "cuda":
            return None
        while len(self._streams) <= producer:
            self._streams.append(torch.cuda.Stream(self.device))
        return self._streams[producer]


class RingPool:
    """Rings of host buffers: one per live iterator, kept for the next iterations (a few of them),
    so that sequential epochs reuse one ring instead of allocating pinned memory again."""

    def __init__(self, make: Callable[[], Ring], keep: int = 2) -> None:
        self._make, self._keep = make, keep
        self._free: list[Ring] = []
        self._lock = threading.Lock()

    def take(self) -> Ring:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._make()

    def give_back(self, ring: Ring) -> None:
        """Keep ``ring`` for another iterator: only once no producer can write into it any more."""
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(ring)


class BatchTransform:
    """The loader's ``transform`` for the batches of one iteration, without autograd; a transform that
    takes a ``generator`` gets one seeded by ``(seed, epoch, rank, global position of the batch)``."""

    def __init__(self, function: Callable[..., torch.Tensor], key: tuple[int, int, int, int, int]) -> None:
        self.function = function
        self.seed, self.epoch, self.rank, self.start, self.step = key
        # CUDA graphs (torch.compile's "reduce-overhead" and "max-autotune") return static buffers that
        # the next replay overwrites, while the consumer may still be reading the batch before: keep a copy.
        self.copy_output = uses_cuda_graphs(function)
        self.takes_generator = takes_generator(function)

    def __call__(self, images: torch.Tensor, *, number: int) -> torch.Tensor:
        with torch.no_grad(), stop_iteration_as_error("transform"):
            if not self.takes_generator:
                out = self.function(images)
            else:
                position = self.start + number * self.step  # where this batch starts in the epoch's order
                digest = hashlib.blake2b(repr((self.seed, self.epoch, self.rank, position)).encode(), digest_size=8)
                seed = int.from_bytes(digest.digest(), "big") >> 1
                out = self.function(images, generator=torch.Generator(device=images.device).manual_seed(seed))
            return out.clone() if self.copy_output and out.is_cuda else out


def _on_consumer_side(transform: BatchTransform | None) -> bool:
    """Whether ``transform`` runs in the consumer's thread, on its stream, when it takes the batch: one
    compiled with CUDA graphs. Its graphs replay into static buffers that every caller shares, with no
    order between replays queued on two producers' streams (each would overwrite the other's batch),
    and torch keeps the graphs' state per thread (torch 2.11 fails an assertion when another thread
    captures one); the consumer's thread is where the user's compiled model runs too, one batch at a time."""
    return transform is not None and transform.copy_output


def uses_cuda_graphs(function: Callable) -> bool:
    """Whether ``function`` was made by ``torch.compile`` with CUDA graphs (``mode="reduce-overhead"``,
    ``"max-autotune"``, or ``options={"triton.cudagraphs": True}``).

    Example:
        >>> uses_cuda_graphs(torch.compile(torch.nn.Identity(), mode="reduce-overhead")), uses_cuda_graphs(abs)
        (True, False)
    """
    config = getattr(function, "get_compiler_config", None)
    return bool(callable(config) and (config() or {}).get("triton.cudagraphs"))


class _Failed:
    """A batch whose gather raised ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Pipeline:
    """The producer threads of one iteration and what they share with it (nothing that keeps the
    iterator alive, so that dropping it runs its finaliser).

    One condition guards it all: the free slots, the batches ready for the consumer, how many
    are prepared ahead (at most ``ahead``), and the stop flag, so stopping wakes every thread at once.
    """

    def __init__(
        self,
        ring: Ring,
        gather: Gather,
        labels: torch.Tensor,
        batches: list[torch.Tensor],
        ahead: int,
        producers: int,
        give_back: Callable[[Ring], None],
        transform: BatchTransform | None,
        prefetcher: BlockPrefetchers | None = None,
        fields: FieldGather | None = None,
    ) -> None:
        self.ring, self.gather, self.labels, self.batches, self.ahead = ring, gather, labels, batches, ahead
        self.fields = fields if fields is not None else FieldGather({})  # the epoch's: its masks' crop
        self.transform = transform
        self.prefetcher = prefetcher  # fetches the coming batches' blocks into the node's cache
        self.give_back = give_back  # called by the last producer to exit
        # Buffers the user may still hold (the last batch of the previous epoch is still bound
        # to the loop variable) go last: by their turn the user has let go of them.
        self.free = deque(sorted(ring.slots, key=lambda slot: slot.held()))
        self.ready: dict[int, Any] = {}
        self.condition = threading.Condition()
        self.next_batch = 0
        self.in_flight = 0  # claimed by a producer, not yet taken by the consumer
        self.stopped = False
        # Streams are made here, in the consumer's thread: a producer never creates CUDA state.
        streams = [ring.stream(i) for i in range(producers)]
        self.threads = [
            threading.Thread(target=self._produce, args=(stream,), name=f"gpuload-gather-{i}", daemon=True)
            for i, stream in enumerate(streams)
        ]
        self.running = producers

    def start(self) -> None:
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        if self.prefetcher is not None:
            self.prefetcher.start()
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float | None = None) -> None:
        current = threading.current_thread()
        for thread in self.threads:
            if thread is not current:
                thread.join(timeout)
        if self.prefetcher is not None:
            self.prefetcher.join(timeout)

    def _produce(self, stream: torch.cuda.Stream | None) -> None:
        limit_torch_threads(default_workers() // len(self.threads))  # the producers share the cores
        try:
            while (claim := self._claim()) is not None:
                self._fill_and_publish(*claim, stream)
        finally:
            self._exit()

    def _exit(self) -> None:
        with self.condition:
            self.running -= 1
            last = self.running == 0
        if last:
            with _RUNNING_LOCK:
                _RUNNING.discard(self)
            self.give_back(self.ring)

    def _fill_and_publish(self, number: int, slot: _Slot, stream: torch.cuda.Stream | None) -> None:
        # A function of its own so that no local keeps a view of the batch once it is published:
        # on the CPU a view left behind would make its slot look held by the user.
        try:
            transform = None
            if self.transform is not None and not _on_consumer_side(self.transform):
                transform = partial(self.transform, number=number)
            item = (slot, *slot.fill(self.gather, self.fields, self.labels, self.batches[number], transform, stream))
        except BaseException as error:  # raised in the consumer when it reaches this batch
            item = _Failed(error)
        with self.condition:
            self.ready[number] = item
            self.condition.notify_all()

    def _claim(self) -> tuple[int, _Slot] | None:
        with self.condition:
            while not self.stopped and self.next_batch < len(self.batches):
                if self.free and self.in_flight < self.ahead:
                    self.in_flight += 1
                    self.next_batch += 1
                    return self.next_batch - 1, self.free.popleft()
                self.condition.wait(_POLL_S)  # a timeout: stop_soon may have set the flag without notifying
            return None

    def take(self, number: int) -> tuple:
        with self.condition:
            while number not in self.ready:
                self.condition.wait()
            self.in_flight -= 1
            self.condition.notify_all()
            item = self.ready.pop(number)
        if isinstance(item, _Failed):
            raise item.error
        return item

    def release(self, slot: _Slot) -> None:
        with self.condition:
            self.free.append(slot)
            self.condition.notify_all()

    def stop(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
        with self.condition:
            self.stopped = True
            self.condition.notify_all()

    def stop_soon(self) -> None:
        """Stop without waiting for anything: the garbage collector's path, in whatever thread it runs
        (maybe a producer holding the condition, or while another waits on it). The producers see
        the flag when notified now, if the condition is free, or else at their next poll."""
        if self.prefetcher is not None:
            self.prefetcher.stop()
        self.stopped = True
        if self.condition.acquire(blocking=False):
            try:
                self.condition.notify_all()
            finally:
                self.condition.release()


@dataclass(frozen=True)
class ServedBatch:
    """Which samples the batch a loader served last holds: its epoch, the dataset indices, its device."""

    epoch: int
    indices: torch.Tensor
    device: torch.device


class EpochIterator:
    """One epoch of a :class:`DataLoader`; closing it (or dropping it) stops its threads."""

    def __init__(
        self,
        loader: DataLoader,
        rings: RingPool,
        batches: list[torch.Tensor],
        position: Position,
        gather: Gather,
        transform: BatchTransform | None,
        prefetcher: BlockPrefetchers | None = None,
        fields: FieldGather | None = None,
    ) -> None:
        self.position = position
        self.served = 0
        self.total = len(batches)
        self._batches = batches
        self._loader = weakref.ref(loader)  # told which samples each batch holds (DataLoader.uniforms)
        self.closed = False
        self.fields = bool(loader._fields)
        self._pipeline = _Pipeline(
            rings.take(),
            gather,
            loader._labels,
            batches,
            loader._ahead,
            min(loader.threads, max(1, self.total)),
            rings.give_back,
            transform,
            prefetcher,
            fields,
        )
        self._held: deque[_Slot] = deque()  # CPU: slots of the last two batches yielded
        self._pipeline.start()
        # Dropping the iterator (a `break`, the garbage collector) stops its producers without
        # waiting for them; the last one to exit gives the ring back.
        self._finalizer = weakref.finalize(self, self._pipeline.stop_soon)

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self.total - self.served

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor] | dict[str, torch.Tensor | list[str]]:
        if self.closed:
            raise StopIteration
        if self.served == self.total:
            self.position.finished = True
            self.close()
            raise StopIteration
        if len(self._held) == 2:
            self._pipeline.release(self._held.popleft())
        try:
            slot, images, labels, extra, event = self._pipeline.take(self.served)
        except BaseException:
            self.close()
            raise
        if event is None:
            self._held.append(slot)  # the CPU batch is a view of the slot
        else:
            stream = torch.cuda.current_stream(images.device)
            _stream_waits(stream, event)
            _record_on(stream, images, labels, *tensors(extra))
            self._pipeline.release(slot)  # refilled only after its event: the copy is done
        if _on_consumer_side(self._pipeline.transform):  # after the wait: queued on the consumer's stream
            images = self._pipeline.transform(images, number=self.served)
        loader = self._loader()
        if loader is not None:
            loader._served = ServedBatch(self.position.epoch, self._batches[self.served], images.device)
        self.served += 1
        if self._pipeline.prefetcher is not None:
            self._pipeline.prefetcher.served(self.served)
        self.position.advance(len(labels))
        self.position.finished = self.served == self.total  # a checkpoint now resumes at the next epoch
        if self.fields:  # a dataset with fields: every one by name, as ds[i] gives them
            return {"image": images, "label": labels, **extra}
        return images, labels

    def close(self) -> None:
        """Stop the background threads and wait for them (done at the end of the epoch and on errors).

        Dropping the iterator (a ``break``) stops them too, without waiting.
        """
        self.closed = True
        self._finalizer.detach()
        self._pipeline.stop()
        self._pipeline.join()


# Pipelines whose producers run. Daemon threads still inside torch when the interpreter finalises
# abort the process ("terminate called without an active exception"), so they are stopped and
# joined at exit, before that happens.
_RUNNING: set[_Pipeline] = set()
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_producers_at_exit() -> None:
    with _RUNNING_LOCK:
        pipelines = list(_RUNNING)
    for pipeline in pipelines:
        pipeline.stop_soon()
    for pipeline in pipelines:
        pipeline.join(timeout=_EXIT_JOIN_S)
