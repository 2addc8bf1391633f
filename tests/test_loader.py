import contextlib
import gc
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import SIZE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import gpuload.loading.crop
from gpuload import DataLoader, ImageData, MemmapImageDataset, RandomResizedCrop, UsageError
from gpuload.loading import gathers as gathers_module
from gpuload.loading import loader as loader_module
from gpuload.loading import pipeline as pipeline_module
from gpuload.loading.crop import CenterCropDecode, RandomResizedCropDecode, decode_crops
from gpuload.loading.order import epoch_order


def indexed_data(count=23, size=(4, 5)) -> ImageData:
    """Images whose pixels and labels both spell out their index, so every batch can be checked."""
    index = torch.arange(count)
    images = (index.view(-1, 1, 1, 1) * 7 + torch.arange(3 * size[0] * size[1]).view(1, 3, *size)) % 251
    return ImageData(images=images.to(torch.uint8), labels=index, batch_size=[count])


def gather_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("gpuload-gather")]


@contextlib.contextmanager
def as_rank(rank: int, world_size: int):
    """Make the loader believe it runs as ``rank`` of ``world_size`` processes (no processes needed)."""
    with mock.patch.object(loader_module, "distributed_rank", return_value=(rank, world_size)):
        yield


def wait_for_no_gather_threads(timeout: float = 5) -> bool:
    """Whether every gather thread ended within ``timeout`` seconds (a dropped iterator's end without waiting)."""
    deadline = time.monotonic() + timeout
    while gather_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def served_indices(loader) -> list[int]:
    data = loader.dataset
    out = []
    for images, labels in loader:
        assert torch.equal(images, data.images[labels])  # pixels belong to the labels' indices
        out += labels.tolist()
    return out


class TestBatches:
    def test_real_dataset_matches_the_memmap(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        loader = DataLoader(dataset, batch_size=6, shuffle=False, device="cpu")
        batches = list(loader)
        assert [len(images) for images, _ in batches] == [6, 6, 6, 2]
        images = torch.cat([images for images, _ in batches])
        labels = torch.cat([labels for _, labels in batches])
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert torch.equal(images, dataset.data.images) and torch.equal(labels, dataset.data.labels)

    @pytest.mark.parametrize("drop_last, expected", [(False, 5), (True, 4)])
    def test_len_and_drop_last(self, drop_last, expected):
        loader = DataLoader(indexed_data(23), batch_size=5, drop_last=drop_last, device="cpu")
        assert len(loader) == expected
        sizes = [len(labels) for _, labels in loader]
        assert len(sizes) == expected and sizes[:4] == [5] * 4

    def test_every_epoch_is_a_permutation_and_differs(self):
        loader = DataLoader(indexed_data(), batch_size=4, shuffle=True, device="cpu")
        epochs = [served_indices(loader) for _ in range(3)]
        for order in epochs:
            assert sorted(order) == list(range(23))
        assert epochs[0] != epochs[1] != epochs[2]

    def test_order_is_the_seeded_epoch_order(self):
        loader = DataLoader(indexed_data(), batch_size=4, shuffle=True, seed=9, device="cpu")
        loader.set_epoch(5)
        assert served_indices(loader) == epoch_order(23, epoch=5, seed=9, shuffle=True).tolist()

    def test_same_seed_same_order_and_torch_manual_seed_decides_it(self):
        def orders(**kwargs):
            return served_indices(DataLoader(indexed_data(), batch_size=4, shuffle=True, device="cpu", **kwargs))

        assert orders(seed=3) == orders(seed=3)
        torch.manual_seed(0)
        first = orders()
        torch.manual_seed(0)
        assert orders() == first
        assert orders(generator=torch.Generator().manual_seed(1)) == orders(generator=torch.Generator().manual_seed(1))

    def test_set_epoch_replays_an_epoch(self):
        loader = DataLoader(indexed_data(), batch_size=4, shuffle=True, device="cpu")
        loader.set_epoch(2)
        first = served_indices(loader)
        assert served_indices(loader) != first  # the epoch advanced on its own
        loader.set_epoch(2)
        assert served_indices(loader) == first

    @pytest.mark.parametrize("length, world_size, batch_size", [(10, 3, 2), (23, 4, 5), (9, 2, 2)])
    @pytest.mark.parametrize("drop_last", [False, True])
    def test_shards_and_batches_are_torchs_with_a_distributed_sampler(self, length, world_size, batch_size, drop_last):
        """As ``DataLoader(drop_last=..., sampler=DistributedSampler(drop_last=False))``: the shards
        are always padded to the same length, and ``drop_last`` only drops each rank's last incomplete batch."""
        for rank in range(world_size):
            sampler = DistributedSampler(range(length), world_size, rank, shuffle=True, seed=3)
            expected = torch.utils.data.DataLoader(range(length), batch_size, sampler=sampler, drop_last=drop_last)
            with as_rank(rank, world_size):
                loader = DataLoader(indexed_data(length), batch_size, True, drop_last=drop_last, seed=3, device="cpu")
                assert [labels.tolist() for _, labels in loader] == [batch.tolist() for batch in expected]
                assert len(loader) == len(expected)

    def test_sampler(self):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=[5, 0, 22, 5, 1], device="cpu")
        assert served_indices(loader) == [5, 0, 22, 5, 1]
        assert len(loader) == 3

    @pytest.mark.parametrize(
        "arguments, error, message",
        [
            ({"sampler": [0], "shuffle": True}, ValueError, "sampler option is mutually exclusive with shuffle"),
            ({"batch_size": 0}, ValueError, "batch_size must be at least 1, got 0"),
            ({"batch_size": True}, TypeError, "batch_size must be an int, got bool: True"),
            ({"batch_size": 4.0}, TypeError, "batch_size must be an int, got float: 4.0"),
            ({"batch_size": "4"}, TypeError, "batch_size must be an int, got str: '4'"),
            ({"prefetch": 0}, ValueError, "prefetch must be at least 1, got 0"),
            ({"prefetch": 2.5}, TypeError, "prefetch must be an int, got float: 2.5"),
            ({"threads": 0}, ValueError, "threads must be at least 1, got 0"),
            ({"threads": False}, TypeError, "threads must be an int, got bool: False"),
            ({"shuffle": 1}, TypeError, "shuffle must be True or False, got int: 1"),
            ({"shuffle": None}, TypeError, "shuffle must be True or False, got NoneType: None"),
            ({"drop_last": "yes"}, TypeError, "drop_last must be True or False, got str: 'yes'"),
            ({"seed": 2**64 - 1}, ValueError, r"seed must be in \[0, 2\*\*63\), got 18446744073709551615"),
            ({"seed": -1}, ValueError, r"seed must be in \[0, 2\*\*63\), got -1"),
            ({"seed": 1.0}, TypeError, "seed must be an int, got float: 1.0"),
            ({"generator": 3}, TypeError, "generator must be a torch.Generator or None, got int: 3"),
            ({"sampler": 5}, TypeError, "sampler must be an iterable of indices, got int: 5"),
        ],
    )
    def test_bad_arguments(self, arguments, error, message):
        with pytest.raises(error, match=message):
            DataLoader(indexed_data(), **arguments)

    def test_not_a_dataset(self):
        with pytest.raises(TypeError, match="MemmapImageDataset"):
            DataLoader([(torch.zeros(3, 2, 2), 0)])

    @pytest.mark.parametrize(
        "name, value",
        [
            ("batch_size", 8),
            ("drop_last", True),
            ("sampler", [0, 1]),
            ("dataset", indexed_data(4)),
            ("device", "cpu"),  # the host buffers are made for the device and the prefetch depth
            ("prefetch", 5),
        ],
    )
    def test_settings_that_shape_the_batches_are_fixed_after_construction(self, name, value):
        loader = DataLoader(indexed_data(), batch_size=4, device="cpu")
        with pytest.raises(ValueError, match=f"{name} attribute should not be set after DataLoader is initialized"):
            setattr(loader, name, value)
        assert len(list(loader)) == 6  # unchanged
        loader.shuffle = True  # what torch's DataLoader allows stays allowed
        assert loader.shuffle

    def test_default_device_without_cuda(self):
        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert DataLoader(indexed_data()).device.type == expected

    @pytest.mark.parametrize("device", ["mps", "xpu", "meta", torch.device("xpu", 1)])
    def test_devices_other_than_cpu_and_cuda_are_refused(self, device):
        with pytest.raises(
            ValueError, match=r"copies to 'cpu' or 'cuda' devices, got '(mps|xpu|meta|xpu:1)'; use device='cpu'"
        ):
            DataLoader(indexed_data(), device=device)

    @pytest.mark.parametrize("device", ["tpu", "cuda:x", ""])
    def test_a_device_torch_does_not_know_is_a_usage_error(self, device):
        with pytest.raises(UsageError, match=f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}"):
            DataLoader(indexed_data(), device=device)

    @pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)], ids=["any", "index0", "index1"])
    def test_cuda_without_cuda_is_refused(self, device, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        with pytest.raises(ValueError, match=r"CUDA is not available.*use device='cpu'"):
            DataLoader(indexed_data(), device=device)

    def test_errors_in_the_gather_reach_the_consumer(self, monkeypatch):
        calls = []
        real = gathers_module.index_select

        def failing(*args):
            calls.append(1)
            if len(calls) == 2:
                raise OSError("a disk error on the second batch")
            return real(*args)

        monkeypatch.setattr(gathers_module, "index_select", failing)
        loader = DataLoader(indexed_data(), batch_size=2, device="cpu", threads=1)
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(OSError, match="a disk error on the second batch"):
            next(iterator)
        assert not gather_threads()

    @pytest.mark.parametrize(
        ("sampler", "shown"),
        [
            ([1.7, 2.9], "float: 1.7"),
            ([[1, 2], [3, 4]], r"list: \[1, 2\]"),
            (["1"], "str: '1'"),
            ([True, 0], "bool: True"),
            (torch.utils.data.BatchSampler(range(4), 2, False), r"list: \[0, 1\]"),
        ],
    )
    def test_a_sampler_must_give_integer_indices(self, sampler, shown):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=sampler, device="cpu")
        with pytest.raises(UsageError, match=f"a sampler gives one integer index at a time, got {shown}"):
            iter(loader)

    def test_integer_indices_of_any_kind_are_taken(self):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=torch.tensor([5, 0]), device="cpu")
        ((images, labels),) = list(loader)
        assert labels.tolist() == [5, 0]
        loader = DataLoader(indexed_data(), batch_size=2, sampler=np.array([3, 1]), device="cpu")
        assert [labels.tolist() for _, labels in loader] == [[3, 1]]

    def test_a_sampler_without_a_length_has_no_len(self):
        """As torch's DataLoader: the number of batches of an iterator is unknown."""
        loader = DataLoader(indexed_data(), batch_size=2, sampler=iter(range(4)), device="cpu")
        with pytest.raises(TypeError, match="has no len"):
            len(loader)
        assert len(list(loader)) == 2

    def test_a_state_past_a_samplers_end_is_refused(self):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=[0, 1, 2], device="cpu")
        state = loader.state_dict() | {"global_position": 9}
        with pytest.raises(ValueError, match=r"global_position 9 is not in \[0, 3\]"):
            loader.load_state_dict(state)

    @pytest.mark.parametrize(
        ("epoch", "error"),
        [(1.5, TypeError), (True, TypeError), ("3", TypeError), (-1, ValueError), (2**70, ValueError)],
    )
    def test_set_epoch_checks_its_argument(self, epoch, error):
        with pytest.raises(error, match="epoch must be"):
            DataLoader(indexed_data(), batch_size=2, device="cpu").set_epoch(epoch)

    @pytest.mark.parametrize("epoch", [np.int64(3), torch.tensor(3)])
    def test_set_epoch_takes_numpy_and_tensor_integers_as_distributed_sampler_does(self, epoch):
        loader = DataLoader(indexed_data(), batch_size=2, shuffle=True, device="cpu")
        loader.set_epoch(epoch)
        assert loader.epoch == 3 and type(loader.state_dict()["epoch"]) is int

    def test_a_batch_size_larger_than_the_dataset_allocates_what_an_epoch_needs(self):
        loader = DataLoader(indexed_data(), batch_size=10**9, device="cpu")  # buffers of 10**9 would not fit
        ((images, labels),) = list(loader)
        assert len(images) == len(indexed_data().labels)

    @pytest.mark.parametrize(
        ("images", "labels", "message"),
        [
            (torch.zeros(4, 3, 2, 2), torch.arange(4), r"uint8 images \[N, C, H, W\], got torch.float32"),
            (
                torch.zeros(4, 2, 2, dtype=torch.uint8),
                torch.arange(4),
                r"uint8 images \[N, C, H, W\], got torch.uint8 \[4, 2, 2\]",
            ),
            (torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4, dtype=torch.int32), "int64 labels"),
            (torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.int64), "int64 labels"),
        ],
    )
    def test_an_image_data_of_other_dtypes_or_shapes_is_refused(self, images, labels, message):
        data = ImageData(images=images, labels=labels, batch_size=[4])
        with pytest.raises(UsageError, match=message):
            DataLoader(data, batch_size=2, device="cpu")

    def test_crops_of_images_that_are_not_rgb_are_refused(self):
        data = ImageData(images=torch.zeros(4, 1, 8, 8, dtype=torch.uint8), labels=torch.arange(4), batch_size=[4])
        with pytest.raises(UsageError, match="decode= crops RGB images"):
            DataLoader(data, batch_size=2, device="cpu", decode=CenterCropDecode(4))

    def test_a_refused_sampler_skips_no_epoch(self):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=[0, 99], device="cpu")
        with pytest.raises(UsageError, match="the sampler gave index 99"):
            iter(loader)
        assert loader.epoch == 0 and loader.state_dict()["epoch"] == 0

    @pytest.mark.parametrize("bad", [99, -1])
    @pytest.mark.parametrize("kind", ["raw", "jpeg"])
    def test_a_sampler_index_outside_the_dataset_is_refused_before_any_read(
        self, built_dataset, jpeg_dataset, bad, kind, monkeypatch
    ):
        dataset = MemmapImageDataset(built_dataset if kind == "raw" else jpeg_dataset)
        decode = CenterCropDecode(8) if kind == "jpeg" else None
        monkeypatch.setattr(MemmapImageDataset, "read_jpeg", None)  # any read would fail otherwise
        loader = DataLoader(dataset, batch_size=2, sampler=[0, bad, 1], decode=decode, device="cpu")
        with pytest.raises(
            UsageError, match=f"the sampler gave index {bad}, and the dataset has 20 images \\(indices 0 to 19\\)"
        ):
            iter(loader)


class TestBuffers:
    def test_batches_kept_by_the_user_stay_intact(self):
        data = indexed_data(40)
        loader = DataLoader(data, batch_size=3, shuffle=True, prefetch=1, device="cpu")
        kept = list(loader)  # every batch kept: their buffers must never be refilled
        views = [images[0] for images, _ in DataLoader(data, batch_size=3, prefetch=1, device="cpu")]
        for images, labels in kept:
            assert torch.equal(images, data.images[labels])
        assert torch.equal(torch.stack(views), data.images[0::3])

    def test_buffers_are_reused_when_batches_are_dropped(self):
        loader = DataLoader(indexed_data(60), batch_size=3, prefetch=2, device="cpu")
        for _ in range(2):
            pointers = {images.data_ptr() for images, labels in loader}
        assert len(pointers) <= loader.prefetch + 2  # bounded: the ring, not one buffer per batch

    def test_a_new_buffer_when_the_user_still_holds_the_old_one(self):
        loader = DataLoader(indexed_data(12), batch_size=3, prefetch=1, device="cpu")
        kept = []
        for images, _ in loader:
            kept.append(images.numpy())  # a numpy view also holds the buffer
        assert len({array.ctypes.data for array in kept}) == 4
        for array, start in zip(kept, range(0, 12, 3)):
            assert (torch.from_numpy(array) == indexed_data(12).images[start : start + 3]).all()

    @pytest.mark.parametrize(
        "keep",
        [
            lambda images, labels: images[1:],
            lambda images, labels: images[:, 0].permute(1, 2, 0).contiguous().view(-1)[:5],  # a copy: frees it
            lambda images, labels: images.permute(0, 2, 3, 1),
            lambda images, labels: images.view(len(images), -1),
            lambda images, labels: images[-1].numpy(),
            lambda images, labels: images.numpy()[1:, 2],
            lambda images, labels: memoryview(images.numpy()),
            lambda images, labels: labels,
            lambda images, labels: labels.numpy()[::2],
        ],
        ids=["slice", "copy", "permute", "view", "numpy", "numpy_slice", "memoryview", "labels", "labels_numpy"],
    )
    def test_whatever_still_sees_a_batch_keeps_its_buffer(self, keep):
        data = indexed_data(30)
        loader = DataLoader(data, batch_size=3, shuffle=True, prefetch=1, device="cpu")
        kept = [(keep(images, labels), labels.clone()) for images, labels in loader]
        for _ in range(2):
            for _ in loader:  # epochs that refill every buffer nobody holds
                pass
        for view, labels in kept:
            assert np.array_equal(np.asarray(view), np.asarray(keep(data.images[labels], labels)))

    def test_a_view_let_go_of_before_its_buffers_turn_costs_no_new_buffer(self):
        loader = DataLoader(indexed_data(60), batch_size=3, prefetch=1, device="cpu")
        pointers = set()
        for images, _ in loader:
            view = images[1:].numpy()
            pointers.add(images.data_ptr())
            del view
        assert len(pointers) <= loader.prefetch + 2

    @pytest.mark.parametrize("module", ["loader", "pipeline", "device", "gathers", "concat"])
    def test_the_loader_uses_no_private_torch_api(self, module):
        source = (Path(loader_module.__file__).parent / f"{module}.py").read_text()
        assert not re.findall(r"torch(?:\.\w+)*\._\w+|\._cdata\b", source)


class TestShutdown:
    def test_no_threads_left_after_epochs(self):
        loader = DataLoader(indexed_data(), batch_size=2, prefetch=1, device="cpu")
        for _ in range(3):
            alive = [bool(gather_threads()) for _ in loader]
            assert alive[0]  # 12 batches, 1 ahead: the gatherers are still at work after the first
            assert not gather_threads()

    def test_break(self):
        loader = DataLoader(indexed_data(), batch_size=2, prefetch=1, device="cpu")
        for _ in loader:
            assert gather_threads()
            break
        assert wait_for_no_gather_threads()

    def test_exception_in_the_loop_body(self):
        loader = DataLoader(indexed_data(), batch_size=2, device="cpu")
        with pytest.raises(KeyError):
            for _ in loader:
                raise KeyError("boom")
        gc.collect()
        assert wait_for_no_gather_threads()

    def test_garbage_collection_of_a_half_read_iterator(self):
        iterator = iter(DataLoader(indexed_data(), batch_size=2, device="cpu"))
        next(iterator)
        del iterator
        gc.collect()
        assert wait_for_no_gather_threads()

    def test_the_finaliser_in_a_producer_holding_the_condition_does_not_deadlock(self, monkeypatch):
        """The garbage collector may run an iterator's finaliser in any thread: here in one of its own
        producers while it holds the pipeline's condition and the other producer waits on it."""
        loader = DataLoader(indexed_data(), batch_size=2, prefetch=1, threads=2, device="cpu")
        ready, calls = threading.Event(), []
        publish = pipeline_module._Pipeline._fill_and_publish

        def finalise_while_holding_the_condition(pipeline, number, slot, stream):
            if number == 0:  # prefetch=1: the other producer waits on the condition meanwhile
                ready.wait(5)
                with pipeline.condition:
                    finalise()  # what the garbage collector would do at an allocation here
                calls.append("returned")
            publish(pipeline, number, slot, stream)

        monkeypatch.setattr(pipeline_module._Pipeline, "_fill_and_publish", finalise_while_holding_the_condition)
        iterator = iter(loader)
        finalise = iterator._finalizer
        ready.set()
        assert wait_for_no_gather_threads(timeout=5)  # before the fix: both producers deadlocked
        assert calls == ["returned"]

    def test_a_ring_goes_back_to_the_pool_only_when_its_producers_have_exited(self, monkeypatch):
        loader = DataLoader(indexed_data(), batch_size=2, prefetch=1, threads=1, device="cpu")
        gathering, release = threading.Event(), threading.Event()
        publish = pipeline_module._Pipeline._fill_and_publish

        def slow_first_gather(pipeline, number, slot, stream):
            if not gathering.is_set():
                gathering.set()
                release.wait(5)
            publish(pipeline, number, slot, stream)

        monkeypatch.setattr(pipeline_module._Pipeline, "_fill_and_publish", slow_first_gather)
        first = iter(loader)
        ring = first._pipeline.ring
        assert gathering.wait(5)
        del first  # the finaliser stops the producer without waiting for its gather to end
        gc.collect()
        second = iter(loader)
        assert second._pipeline.ring is not ring  # still being written: not in the pool
        release.set()
        assert len(list(second)) == 12
        assert wait_for_no_gather_threads()
        assert any(pooled is ring for pooled in loader._ring_pool(torch.device("cpu"))._free)  # back once it exited

    def test_the_interpreter_exits_cleanly_right_after_iterators_are_dropped(self, tmp_path):
        """Daemon producers still inside torch when the interpreter finalises abort the process
        ("terminate called without an active exception"): they must be stopped and joined first."""
        script = tmp_path / "drop_and_exit.py"
        script.write_text(
            textwrap.dedent("""
                import torch
                from gpuload import DataLoader, ImageData

                images = torch.zeros(512, 3, 256, 256, dtype=torch.uint8)
                data = ImageData(images=images, labels=torch.arange(512), batch_size=[512])
                loader = DataLoader(data, batch_size=128, prefetch=2, threads=2, device="cpu")
                iterators = [iter(loader) for _ in range(4)]
                for iterator in iterators:
                    next(iterator)
                del iterators, iterator  # the producers are mid-gather when the interpreter exits
            """)
        )
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr) == (0, "")  # before the fix: -6, "terminate called..."


class TestIterators:
    def test_zip_of_a_loader_with_itself_yields_pairs_of_whole_epochs(self):
        data = indexed_data(23)
        loader = DataLoader(data, batch_size=4, shuffle=True, seed=2, device="cpu")
        pairs = list(zip(loader, loader))
        assert len(pairs) == 6
        for side, epoch in ((0, 0), (1, 1)):  # each iter() advances the epoch, as before
            assert (
                torch.cat([pair[side][1] for pair in pairs]).tolist()
                == epoch_order(23, epoch=epoch, seed=2, shuffle=True).tolist()
            )
            for images, labels in (pair[side] for pair in pairs):
                assert torch.equal(images, data.images[labels])

    def test_a_second_iterator_does_not_end_the_first(self):
        loader = DataLoader(indexed_data(), batch_size=2, device="cpu")
        first = iter(loader)
        next(first)
        second = iter(loader)
        assert len(list(first)) == 11
        assert len(list(second)) == 12

    def test_live_iterators_have_their_own_ring_and_sequential_epochs_share_one(self):
        loader = DataLoader(indexed_data(60), batch_size=3, prefetch=2, device="cpu")
        first, second = iter(loader), iter(loader)
        assert first._pipeline.ring is not second._pipeline.ring
        rings = [first._pipeline.ring, second._pipeline.ring]
        assert len(list(first)) == len(list(second)) == 20
        sequential = []
        for _ in range(3):
            iterator = iter(loader)
            sequential.append(iterator._pipeline.ring)
            assert len(list(iterator)) == 20
        assert sequential[0] is sequential[1] is sequential[2]  # taken back from the pool: no new buffers
        assert any(sequential[0] is ring for ring in rings)

    def test_state_dict_describes_the_latest_iterator(self):
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, device="cpu")
        first = iter(loader)
        for _ in range(3):
            next(first)
        second = iter(loader)
        next(second)
        assert loader.state_dict() == state(1, 4)
        next(first)
        assert loader.state_dict() == state(1, 4)


def state(
    epoch, position, *, batch_size=4, world_size=1, length=23, seed=1, block_shuffle=0, order_world_size=None
) -> dict[str, int]:
    return {
        "epoch": epoch,
        "global_position": position,
        "batch_size": batch_size,
        "world_size": world_size,
        "dataset_length": length,
        "seed": seed,
        "block_shuffle": block_shuffle,
        "order_world_size": world_size if order_world_size is None else order_world_size,
        "block_layout": 0,  # 0: not recorded (an exact shuffle, or a state from before it was)
    }


def labels_of(batches) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


class TestResume:
    def test_resume_serves_exactly_the_remaining_batches_without_reading_the_others(self, monkeypatch):
        data = indexed_data(23)
        loader = DataLoader(data, batch_size=4, shuffle=True, device="cpu")
        loader.set_epoch(3)
        iterator = iter(loader)
        before = labels_of(batch for _, batch in zip(range(2), iterator))
        saved = loader.state_dict()
        rest = labels_of(iterator)
        assert saved == state(3, 8, seed=loader.seed)

        gathered = []
        index_select = torch.index_select
        monkeypatch.setattr(
            torch,
            "index_select",
            lambda source, dim, index, **kwargs: (
                (source.dim() == 1 and gathered.append(index.tolist())) or index_select(source, dim, index, **kwargs)
            ),
        )
        restarted = DataLoader(data, batch_size=4, shuffle=True, device="cpu")  # another seed until loaded
        restarted.load_state_dict(saved)
        restarted.set_epoch(3)  # what a training loop does at the top of the epoch
        iterator = iter(restarted)
        assert len(iterator) == len(rest)
        assert labels_of(iterator) == rest
        assert sorted(gathered) == sorted(rest)  # the served batches were never gathered again
        assert sorted(sum(before + rest, [])) == list(range(23))
        assert restarted.state_dict() == state(4, 0, seed=loader.seed)

    def test_state_dict_after_a_break_is_the_exact_position(self):
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, device="cpu")
        for number, _ in enumerate(loader):
            if number == 2:
                break
        assert loader.state_dict() == state(0, 12)  # three batches were yielded
        assert len(served_indices(loader)) == 23  # a new iteration is a new epoch, as before
        assert loader.state_dict() == state(2, 0)

    @pytest.mark.parametrize("drop_last", [False, True])
    def test_a_checkpoint_at_the_last_batch_is_the_next_epoch(self, drop_last):
        """Saved in the loop body at the last step, before StopIteration: resuming must not run an empty epoch."""
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, drop_last=drop_last, device="cpu")
        for _ in loader:
            saved = loader.state_dict()
        assert saved == state(1, 0)
        resumed = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=0, drop_last=drop_last, device="cpu")
        resumed.load_state_dict(saved)
        assert len(served_indices(resumed)) == (20 if drop_last else 23)  # a whole epoch 1

    def test_state_dict_right_after_loading_is_the_loaded_state(self):
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=9, device="cpu")
        loaded = state(5, 12, batch_size=3, world_size=2)
        loader.load_state_dict(loaded)
        assert loader.state_dict() == loaded
        loader.set_epoch(5)
        assert loader.state_dict()["global_position"] == 12
        loader.set_epoch(6)  # another epoch: the resume is discarded
        assert loader.state_dict() == state(6, 0)

    def test_state_dict_is_plain_ints_that_survive_torch_save(self, tmp_path):
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, device="cpu")
        iterator = iter(loader)
        next(iterator)
        saved = loader.state_dict()
        assert all(type(value) is int for value in saved.values())
        torch.save({"loader": saved}, tmp_path / "checkpoint.pt")
        assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["loader"] == saved == state(0, 4)

    def test_the_global_position_counts_every_rank(self):
        states = []
        for rank in range(3):
            with as_rank(rank, 3):
                loader = DataLoader(indexed_data(10), batch_size=2, shuffle=True, seed=1, device="cpu")
                iterator = iter(loader)  # 10 samples, 3 ranks: 4 each (2 padding), 2 batches each
                next(iterator)
                states.append([loader.state_dict()["global_position"]])
                next(iterator)
                states[-1].append(loader.state_dict()["global_position"])
        assert states == [[6, 0]] * 3  # 2 x 3; then every batch was served: epoch 1 at 0
        assert loader.state_dict()["epoch"] == 1

    def test_set_epoch_to_another_epoch_discards_the_resume(self):
        loader = DataLoader(indexed_data(), batch_size=4, shuffle=True, seed=1, device="cpu")
        loader.load_state_dict(state(0, 20))
        loader.set_epoch(1)
        assert len(served_indices(loader)) == 23

    def test_a_sampler_resumes_on_the_same_world_size(self):
        loader = DataLoader(indexed_data(), batch_size=2, sampler=[5, 0, 22, 5, 1], device="cpu")
        loader.load_state_dict(state(0, 2, seed=loader.seed))
        assert served_indices(loader) == [22, 5, 1]

    def test_a_sampler_cannot_resume_on_another_world_size(self):
        with as_rank(0, 2):
            loader = DataLoader(indexed_data(), batch_size=2, sampler=[5, 0, 22], device="cpu")
            with pytest.raises(
                ValueError, match="saved with world size 4, this run has world size 2; a user-given sampler"
            ):
                loader.load_state_dict(state(0, 4, world_size=4))

    def test_another_dataset_is_refused(self):
        loader = DataLoader(indexed_data(10), device="cpu")
        with pytest.raises(ValueError, match="state_dict is for a dataset of 23 images, this loader's has 10"):
            loader.load_state_dict(state(0, 4, length=23))

    @pytest.mark.parametrize("position", [-1, 24])
    def test_a_position_outside_the_epoch_is_refused(self, position):
        loader = DataLoader(indexed_data(23), device="cpu")
        with pytest.raises(ValueError, match=f"global_position {position} is not in \\[0, 23\\]"):
            loader.load_state_dict(state(0, position))

    def test_an_older_state_dict_is_refused(self):
        loader = DataLoader(indexed_data(23), device="cpu")
        with pytest.raises(ValueError, match="lacks global_position, batch_size, world_size, dataset_length"):
            loader.load_state_dict({"epoch": 0, "batches_served": 2, "seed": 1})

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        length=st.integers(1, 30),
        world_size=st.integers(1, 4),
        batch_size=st.integers(1, 6),
        new_world_size=st.integers(1, 4),
        new_batch_size=st.integers(1, 6),
        shuffle=st.booleans(),
        data=st.data(),
    )
    def test_interrupted_and_resumed_serves_every_sample_once(
        self, length, world_size, batch_size, new_world_size, new_batch_size, shuffle, data
    ):
        """Ranks (simulated) stop after the same number of batches and save rank 0's state; the job
        resumes on another (or the same) number of ranks with another (or the same) batch size."""
        images = indexed_data(length)
        stop = data.draw(st.integers(0, math.ceil(math.ceil(length / world_size) / batch_size)), label="stop")

        def run(rank: int, world: int, batch: int, resume: dict | None, stop: int | None):
            with as_rank(rank, world):
                loader = DataLoader(images, batch, shuffle, seed=5, device="cpu", threads=1, prefetch=1)
                if resume is not None:
                    loader.load_state_dict(resume)
                loader.set_epoch(2)
                batches = loader if stop is None else (batch for _, batch in zip(range(stop), loader))
                return labels_of(batches), loader.state_dict()

        first = [run(rank, world_size, batch_size, None, stop) for rank in range(world_size)]
        saved = first[0][1]
        assert all(other == saved for _, other in first)  # every rank reports the same state
        finished = saved["epoch"] == 3  # every batch of epoch 2 was served: the state is the next epoch
        assert finished or saved["epoch"] == 2
        if finished:
            resumed = [[] for _ in range(world_size)]
        else:
            resumed = [run(rank, new_world_size, new_batch_size, saved, None)[0] for rank in range(new_world_size)]
        served = sum((sum(batches, []) for batches, _ in first), []) + sum(sum(resumed, []), [])
        assert set(served) == set(range(length))
        position = length if finished else saved["global_position"]
        padding_before = sum(len(sum(batches, [])) for batches, _ in first) - position
        assert 0 <= padding_before <= -length % world_size
        assert len(served) == length + padding_before + (-(length - position) % new_world_size)
        if finished or (new_world_size, new_batch_size) == (world_size, batch_size):  # bit-identical to uninterrupted
            uninterrupted = [run(rank, world_size, batch_size, None, None)[0] for rank in range(world_size)]
            assert [batches + rest for (batches, _), rest in zip(first, resumed)] == uninterrupted


class TestUniforms:
    """``loader.uniforms(count)``: each sample's draws for a recipe run in the loop, a function of
    (seed, epoch, dataset index) only, so that a resumed run repeats them."""

    @staticmethod
    def draws(loader, batches=None) -> list[tuple[list[int], torch.Tensor]]:
        out = []
        for number, (_, labels) in enumerate(loader):
            if number == batches:
                break
            out.append((labels.tolist(), loader.uniforms(5)))
        return out

    def test_each_sample_keeps_its_draws_whatever_batch_or_world_size_it_comes_in(self):
        data = indexed_data(23)
        whole = {}
        for labels, draws in self.draws(DataLoader(data, batch_size=4, shuffle=True, seed=1, device="cpu")):
            assert draws.shape == (len(labels), 5) and draws.dtype == torch.float32
            assert bool(((draws >= 0) & (draws < 1)).all())
            whole.update(zip(labels, draws))
        assert len(whole) == 23 and len({tuple(row.tolist()) for row in whole.values()}) == 23
        for world_size in (1, 2, 3):
            for rank in range(world_size):
                with as_rank(rank, world_size):
                    loader = DataLoader(data, batch_size=3, shuffle=True, seed=1, device="cpu")
                    for labels, draws in self.draws(loader):
                        assert all(torch.equal(row, whole[label]) for label, row in zip(labels, draws))

    def test_a_resumed_run_repeats_the_draws_and_another_epoch_changes_them(self):
        data = indexed_data(23)
        loader = DataLoader(data, batch_size=4, shuffle=True, seed=0, device="cpu")
        loader.set_epoch(2)
        iterator = iter(loader)
        next(iterator)
        saved = loader.state_dict()
        rest = [(labels.tolist(), loader.uniforms(5)) for _, labels in iterator]
        resumed = DataLoader(data, batch_size=4, shuffle=True, seed=7, device="cpu")  # its seed until loaded
        resumed.load_state_dict(saved)
        resumed.set_epoch(2)
        again = self.draws(resumed)
        assert [labels for labels, _ in again] == [labels for labels, _ in rest]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(again, rest))
        later = dict(
            (label, row) for labels, draws in self.draws(resumed) for label, row in zip(labels, draws)
        )  # epoch 3
        first = {label: row for labels, draws in rest for label, row in zip(labels, draws)}
        assert not any(torch.equal(first[label], later[label]) for label in first)

    def test_the_draws_are_not_the_crops(self):
        """The decode-time crop keys its draws on (seed, epoch, index) too: the recipe's must be other numbers."""
        from gpuload.loading.crop import counter_uniforms

        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, device="cpu")
        for _, labels in loader:
            crops = counter_uniforms(loader.seed, 0, labels, 5).to(torch.float32)
            assert not torch.isclose(loader.uniforms(5), crops).any()
            break

    def test_no_draw_rounds_up_to_one(self):
        """float32 holds 24 bits: a float64 draw above 1 - 2**-25 (about 5 draws an epoch of ImageNet at 130 a
        sample) must not round to 1.0, which puts a crop's box a row past its image (top = floor(u * (H - h + 1)))."""
        loader = DataLoader(indexed_data(4), batch_size=4, seed=2, device="cpu")
        next(iter(loader))
        draws = loader.uniforms(2_000_000)  # seed 2, index 3: draw 1,834,992 is 0.99999999309 in float64
        assert float(draws.max()) < 1.0

    @pytest.mark.cuda
    def test_the_draws_reach_the_gpu_without_a_host_synchronisation(self):
        """Called every step of the README's loop: a pageable copy would wait for the queued steps each time."""
        loader = DataLoader(indexed_data(8), batch_size=4, seed=1, device="cuda")
        iterator = iter(loader)
        next(iterator)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation inside raises
        try:
            draws = loader.uniforms(130)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert draws.is_cuda and draws.shape == (4, 130)
        on_cpu = DataLoader(indexed_data(8), batch_size=4, seed=1, device="cpu")
        next(iter(on_cpu))
        assert torch.equal(draws.cpu(), on_cpu.uniforms(130))

    def test_the_draws_are_on_the_batchs_device_whatever_its_kind(self):
        """Not only cpu and cuda: a batch on another device (here ``meta``) gets its draws there."""
        from gpuload.loading.pipeline import ServedBatch

        loader = DataLoader(indexed_data(8), batch_size=4, seed=1, device="cpu")
        loader._served = ServedBatch(0, torch.arange(4), torch.device("meta"))
        assert loader.uniforms(3).device.type == "meta"

    def test_before_any_batch_it_says_when_to_call_it(self):
        loader = DataLoader(indexed_data(8), batch_size=4, device="cpu")
        with pytest.raises(UsageError, match="inside the loop over the loader, after each batch"):
            loader.uniforms(3)
        with pytest.raises(ValueError, match="count must be at least 0, got -1"):
            next(iter(loader)) and loader.uniforms(-1)

    def test_a_recipe_with_no_draws_takes_none_in_the_readmes_loop(self):
        """``recipe(images, labels, uniform=loader.uniforms(recipe.draws))`` where the recipe draws nothing on
        the device (its crop in the loader, no policy, no erasing, no mix): ``[B, 0]``, not an error."""
        from gpuload import Recipe

        recipe = Recipe(size=(4, 5), mix=None)
        assert recipe.draws == 0
        loader = DataLoader(indexed_data(8), batch_size=4, device="cpu")
        for images, labels in loader:
            draws = loader.uniforms(recipe.draws)
            assert draws.shape == (4, 0) and draws.dtype == torch.float32
            out, targets = recipe(images, labels, uniform=draws)
            assert out.shape == (4, 3, 4, 5) and torch.equal(targets, labels)


class TestTransform:
    """``transform=`` runs in the background threads, with draws that depend only on where the batch is."""

    def batches(self, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
        augment = RandomResizedCrop(3, flip=True, brightness=0.5)
        loader = DataLoader(indexed_data(40, (12, 16)), batch_size=4, shuffle=True, seed=3, device="cpu",
                            transform=augment, **kwargs)  # fmt: skip
        return [(images.clone(), labels.clone()) for images, labels in loader]

    def test_batches_come_out_augmented(self):
        batches = self.batches()
        assert all(images.shape == (4, 3, 3, 3) and images.dtype == torch.uint8 for images, _ in batches)

    @pytest.mark.parametrize("threads, prefetch", [(1, 1), (2, 3), (3, 2)])
    def test_draws_do_not_depend_on_the_threads(self, threads, prefetch):
        reference = self.batches()
        again = self.batches(threads=threads, prefetch=prefetch)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference, again))

    def test_a_compiled_transform_gets_the_seeded_generator_too(self):
        """Compiled, the module runs the batched resampler (eager on the CPU resizes each sample), from
        the same draws: the same boxes, flips and jitter, pixels within rounding, whatever torch's global RNG."""
        reference = self.batches()
        augment = torch.compile(RandomResizedCrop(3, flip=True, brightness=0.5))

        def compiled(global_seed: int) -> list[torch.Tensor]:
            torch.manual_seed(global_seed)
            loader = DataLoader(indexed_data(40, (12, 16)), batch_size=4, shuffle=True, seed=3, device="cpu",
                                transform=augment, threads=1)  # fmt: skip
            return [images.clone() for images, _ in loader]

        first, second = compiled(0), compiled(1)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
        differences = torch.cat([(a[0].float() - b.float()).abs().flatten() for a, b in zip(reference, first)])
        assert float(differences.mean()) <= 0.5 and float(differences.max()) <= 3

    def test_each_epoch_and_batch_draws_anew(self):
        augment = RandomResizedCrop(3, flip=True)
        images = indexed_data(8, (12, 16))
        constant = ImageData(
            images=images.images[:1].expand(8, -1, -1, -1).contiguous(), labels=images.labels, batch_size=[8]
        )
        loader = DataLoader(constant, batch_size=4, seed=0, device="cpu", transform=augment)
        epochs = [[batch.clone() for batch, _ in loader] for _ in range(2)]
        assert not torch.equal(epochs[0][0], epochs[0][1]) and not torch.equal(epochs[0][0], epochs[1][0])

    def test_a_resumed_epoch_replays_the_same_draws(self):
        augment = RandomResizedCrop(3, flip=True, saturation=0.5)
        data = indexed_data(40, (12, 16))
        loader = DataLoader(data, batch_size=4, shuffle=True, seed=5, device="cpu", transform=augment)
        whole = [images.clone() for images, _ in loader]
        interrupted = DataLoader(data, batch_size=4, shuffle=True, seed=5, device="cpu", transform=augment)
        iterator = iter(interrupted)
        next(iterator), next(iterator), next(iterator)
        state = interrupted.state_dict()
        resumed = DataLoader(data, batch_size=4, shuffle=True, seed=0, device="cpu", transform=augment)
        resumed.load_state_dict(state)
        rest = [images.clone() for images, _ in resumed]
        assert len(rest) == len(whole) - 3 and all(torch.equal(a, b) for a, b in zip(rest, whole[3:]))

    def test_runs_in_the_background_without_autograd(self):
        seen = []

        def record(images):
            seen.append((threading.current_thread().name, torch.is_grad_enabled()))
            return images.float() / 255

        loader = DataLoader(indexed_data(), batch_size=4, device="cpu", transform=record)
        batches = list(loader)
        assert batches[0][0].dtype == torch.float32
        assert all(name.startswith("gpuload-gather") and not grad for name, grad in seen)

    def test_a_transform_must_be_callable(self):
        with pytest.raises(TypeError, match="transform must be callable"):
            DataLoader(indexed_data(), transform="flip")

    def test_one_compiled_with_cuda_graphs_runs_in_the_consumers_thread_with_the_same_draws(self, monkeypatch):
        """Its graphs' static buffers and torch's per-thread graph state cannot be shared by the producers
        (see the CUDA test); each batch gets the generator of its place in the epoch all the same."""
        seen = []
        augment = RandomResizedCrop(3, flip=True, brightness=0.5)

        def graphed(images, generator=None):
            seen.append(threading.current_thread())
            return augment(images, generator=generator)

        reference = self.batches()
        monkeypatch.setattr(pipeline_module, "uses_cuda_graphs", lambda function: function is graphed)
        loader = DataLoader(indexed_data(40, (12, 16)), batch_size=4, shuffle=True, seed=3, device="cpu",
                            transform=graphed, threads=2)  # fmt: skip
        batches = [(images.clone(), labels.clone()) for images, labels in loader]
        assert seen == [threading.current_thread()] * len(loader)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference, batches, strict=True))


class TestJpegDatasets:
    """A jpeg dataset is decoded (and cropped) into the ring by the loader's threads."""

    def batches(self, jpeg_dataset, decode, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=6, shuffle=True, seed=2, device="cpu",
                            decode=decode, **kwargs)  # fmt: skip
        return [(images.clone(), labels.clone()) for images, labels in loader]

    def test_batches_are_the_decoded_crops_of_the_epoch_order(self, jpeg_dataset):
        dataset = MemmapImageDataset(jpeg_dataset)
        decode = RandomResizedCropDecode(16)
        batches = self.batches(jpeg_dataset, decode)
        assert [len(labels) for _, labels in batches] == [6, 6, 6, 2]
        order = epoch_order(20, epoch=0, seed=2, shuffle=True)
        expected = torch.empty((20, 3, 16, 16), dtype=torch.uint8)
        decode_crops(dataset, order, expected, decode, seed=2, epoch=0)
        assert torch.equal(torch.cat([images for images, _ in batches]), expected)
        assert torch.cat([labels for _, labels in batches]).tolist() == dataset.data.labels[order].tolist()

    @pytest.mark.parametrize("threads", [1, 3])
    def test_the_crops_do_not_depend_on_the_threads(self, jpeg_dataset, threads):
        decode = RandomResizedCropDecode(16)
        reference = self.batches(jpeg_dataset, decode, threads=2)
        again = self.batches(jpeg_dataset, decode, threads=threads, prefetch=1)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(reference, again))

    @pytest.mark.parametrize("threads", [2, 4])
    def test_every_decoding_thread_decodes_at_once_whatever_the_prefetch(self, jpeg_dataset, threads, monkeypatch):
        """Each thread decodes a whole batch: ``threads`` batches must be in flight, even with prefetch=1."""
        running, peak, lock = [0], [0], threading.Lock()
        real = gathers_module.decode_crops

        def slow(*args, **kwargs):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)  # long enough for every thread to be handed its batch
            real(*args, **kwargs)
            with lock:
                running[0] -= 1

        monkeypatch.setattr(gathers_module, "decode_crops", slow)
        loader = DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=2, prefetch=1, threads=threads,
                            device="cpu", decode=RandomResizedCropDecode(16))  # fmt: skip
        assert sum(len(labels) for _, labels in loader) == 20
        assert peak[0] == threads

    def test_a_loader_made_before_set_device_under_nccl_is_refused_before_the_broadcast(self, monkeypatch):
        """NCCL broadcasts the seed through the current device: every rank on cuda:0 hangs or fails."""
        broadcasts = []
        monkeypatch.setattr(loader_module.dist, "is_initialized", lambda: True)
        monkeypatch.setattr(loader_module.dist, "get_backend", lambda: "nccl")
        monkeypatch.setattr(loader_module.dist, "broadcast_object_list", lambda *args, **kwargs: broadcasts.append(1))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
        monkeypatch.setenv("LOCAL_RANK", "3")
        with pytest.raises(UsageError, match=r"cuda:0 while LOCAL_RANK is 3: call torch.cuda.set_device\(local_rank\)"):
            loader_module._draw_seed(None, broadcast=True)
        assert broadcasts == []
        for device in (3, 6):  # its own GPU, or any other mapping the user chose (two GPUs a rank)
            monkeypatch.setattr(torch.cuda, "current_device", lambda device=device: device)
            loader_module._draw_seed(None, broadcast=True)
        monkeypatch.setenv("LOCAL_RANK", "0")  # the node's first rank on cuda:0 is right
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        loader_module._draw_seed(None, broadcast=True)
        assert broadcasts == [1, 1, 1]

    def test_a_resumed_epoch_replays_the_same_crops(self, jpeg_dataset):
        dataset = MemmapImageDataset(jpeg_dataset)
        decode = RandomResizedCropDecode(16)
        whole = self.batches(jpeg_dataset, decode)
        loader = DataLoader(dataset, batch_size=6, shuffle=True, seed=2, device="cpu", decode=decode)
        iterator = iter(loader)
        next(iterator)
        resumed = DataLoader(dataset, batch_size=6, shuffle=True, seed=9, device="cpu", decode=decode)
        resumed.load_state_dict(loader.state_dict())
        rest = [images for images, _ in resumed]
        assert all(torch.equal(a, b[0]) for a, b in zip(rest, whole[1:]))

    def test_evaluation_decode(self, jpeg_dataset):
        images, _ = next(iter(DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=4, decode=CenterCropDecode(24))))
        assert images.shape == (4, 3, 24, 24)

    def test_a_jpeg_dataset_needs_a_decode(self, jpeg_dataset):
        with pytest.raises(UsageError, match="a jpeg dataset's images have their own sizes: pass decode="):
            DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=4)
        with pytest.raises(UsageError, match="decode must be a gpuload.RandomResizedCropDecode .* got str"):
            DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=4, decode="crop")

    def test_threads_default_to_the_cores(self, jpeg_dataset):
        from gpuload import default_workers

        loader = DataLoader(MemmapImageDataset(jpeg_dataset), batch_size=4, decode=CenterCropDecode(8))
        assert loader.threads == default_workers()


PINNED_V2 = Path(__file__).parent / "data" / "v2"


class TestLayout:
    """Every batch kind on the CPU is channels-last [B, 3, H, W] (but a channel-first dataset's whole batches)."""

    @staticmethod
    def first(loader: DataLoader) -> torch.Tensor:
        return next(iter(loader))[0]

    @pytest.mark.parametrize("decode", [RandomResizedCropDecode(16), CenterCropDecode(24)])
    def test_cropped_batches(self, jpeg_dataset, built_dataset, decode):
        for path in (jpeg_dataset, built_dataset, PINNED_V2 / "raw.memmap"):
            images = self.first(DataLoader(MemmapImageDataset(path), batch_size=4, decode=decode, device="cpu"))
            assert images.shape == (4, 3, *decode.size)
            assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()

    def test_whole_raw_batches_keep_the_layout_of_their_file(self, built_dataset):
        images = self.first(DataLoader(MemmapImageDataset(built_dataset), batch_size=4, device="cpu"))
        assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
        old = self.first(DataLoader(MemmapImageDataset(PINNED_V2 / "raw.memmap"), batch_size=4, device="cpu"))
        assert old.is_contiguous()

    def test_whole_raw_batches_are_gathered_in_the_files_order(self, built_dataset, monkeypatch):
        """One gather of whole channels-last images into a channels-last buffer: no transposition."""
        seen = []
        real = torch.index_select

        def index_select(source, dim, index, *, out):
            seen.append((source.shape, out.is_contiguous()))
            return real(source, dim, index, out=out)

        monkeypatch.setattr(loader_module.torch, "index_select", index_select)
        dataset = MemmapImageDataset(built_dataset)
        self.first(DataLoader(dataset, batch_size=4, device="cpu", threads=1))
        assert (torch.Size([20, *SIZE, 3]), True) in seen

    def test_a_transform_gets_the_channels_last_batch(self, built_dataset):
        shapes = []

        def transform(images):
            shapes.append(images.is_contiguous(memory_format=torch.channels_last))
            return images

        self.first(DataLoader(MemmapImageDataset(built_dataset), batch_size=4, device="cpu", transform=transform))
        assert shapes and all(shapes)


class TestRawCrops:
    """``decode=`` on a raw dataset: the loader's threads crop each image from the mapped pixels."""

    @pytest.mark.parametrize("channels_last", [True, False])
    def test_the_same_crops_as_the_jpeg_path_of_the_same_pixels(self, jpeg_dataset, channels_last):
        """A raw dataset of the jpeg dataset's own decoded pixels: crop_raw gives exactly what the jpeg
        path gives (accurate decode, boxes under twice the output: no DCT scaling), for the same draws."""
        jpeg = MemmapImageDataset(jpeg_dataset)
        pixels = torch.stack([jpeg[index][0] for index in range(len(jpeg))])
        pixels = pixels.contiguous(memory_format=torch.channels_last) if channels_last else pixels.contiguous()
        raw = ImageData(images=pixels, labels=jpeg.data.labels, batch_size=[len(jpeg)])
        decode = RandomResizedCropDecode(40, scale=(0.3, 0.5), fast=False)
        indices = torch.tensor([5, 0, 17, 9, 0])
        made = [torch.empty(5, 40, 40, 3, dtype=torch.uint8).permute(0, 3, 1, 2) for _ in range(2)]
        gpuload.loading.crop.crop_raw(raw.images, indices, made[0], decode, seed=4, epoch=2)
        decode_crops(jpeg, indices, made[1], decode, seed=4, epoch=2)
        assert torch.equal(made[0], made[1])

    def test_the_loader_serves_crop_raw_in_the_epochs_order(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        decode = RandomResizedCropDecode(8)
        loader = DataLoader(dataset, batch_size=3, shuffle=True, seed=5, decode=decode, device="cpu")
        for epoch in range(2):
            loader.set_epoch(epoch)
            served = torch.cat([images for images, _ in loader])
            order = epoch_order(len(dataset), epoch=epoch, seed=5, shuffle=True)
            expected = torch.empty(len(order), 8, 8, 3, dtype=torch.uint8).permute(0, 3, 1, 2)
            gpuload.loading.crop.crop_raw(dataset.data.images, order, expected, decode, seed=5, epoch=epoch)
            assert torch.equal(served, expected)

    def test_centre_crops_are_torchvision_resize_then_centre_crop(self, built_dataset):
        from torchvision.transforms import v2

        dataset = MemmapImageDataset(built_dataset)
        reference = v2.Compose([v2.Resize(28, antialias=True), v2.CenterCrop(24)])
        loader = DataLoader(dataset, batch_size=4, decode=CenterCropDecode(24, ratio=24 / 28), device="cpu")
        served = torch.cat([images for images, _ in loader])
        for index in range(len(dataset)):
            assert torch.equal(served[index], reference(dataset[index][0]))

    def test_resume_replays_the_same_crops(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        make = lambda: DataLoader(dataset, batch_size=3, shuffle=True, seed=1, decode=RandomResizedCropDecode(8))  # noqa: E731
        whole = [images for images, _ in make()]
        first = make()
        iterator = iter(first)
        next(iterator), next(iterator)
        state = first.state_dict()
        del iterator
        resumed = make()
        resumed.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(whole[2:], [images for images, _ in resumed], strict=True))

    def test_only_the_box_is_read_from_the_mapped_file(self, built_dataset, monkeypatch):
        """The resize gets a view of the box in the mapped file: a channels-last image's rows lie one
        after the other, so only the box's rows are touched, and nothing is copied before the resize."""
        dataset = MemmapImageDataset(built_dataset)
        decode = RandomResizedCropDecode(8)
        seen = []
        real = gpuload.loading.crop._resize_hwc
        monkeypatch.setattr(
            gpuload.loading.crop, "_resize_hwc", lambda pixels, size: seen.append(pixels) or real(pixels, size)
        )
        indices = torch.tensor([7, 2])
        out = torch.empty(2, 8, 8, 3, dtype=torch.uint8).permute(0, 3, 1, 2)
        gpuload.loading.crop.crop_raw(dataset.data.images, indices, out, decode, seed=3, epoch=1)
        boxes, _ = decode.draw(torch.tensor([list(SIZE)] * 2), indices, seed=3, epoch=1)
        row_bytes, image_bytes = SIZE[1] * 3, SIZE[0] * SIZE[1] * 3
        for pixels, index, (top, left, height, width) in zip(seen, indices.tolist(), boxes.tolist(), strict=True):
            assert pixels.shape == (int(height), int(width), 3) and pixels.stride() == (row_bytes, 3, 1)
            offset = pixels.data_ptr() - dataset.data.images.data_ptr()
            assert offset == index * image_bytes + int(top) * row_bytes + int(left) * 3

    def test_gpu_decode_is_refused_on_a_raw_dataset(self, built_dataset):
        with pytest.raises(UsageError, match="a raw dataset holds decoded pixels: crop them in the loader's threads"):
            DataLoader(MemmapImageDataset(built_dataset), batch_size=4, decode=RandomResizedCropDecode(8, gpu=True))

    def test_threads_default_to_the_cores(self, built_dataset):
        from gpuload import default_workers

        dataset = MemmapImageDataset(built_dataset)
        assert DataLoader(dataset, batch_size=4, decode=CenterCropDecode(8)).threads == default_workers()
        assert DataLoader(dataset, batch_size=4).threads == 2


def test_distributed_shards_with_torchrun(built_dataset, tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(Path(__file__).with_name("distributed_shards.py")), str(built_dataset), str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for epoch in ("0", "1", "unseeded"):  # unseeded: each rank called torch.manual_seed(rank)
        shards = [set(rank["served"][epoch]["indices"]) for rank in ranks]
        assert all(
            rank["world_size"] == 2 and rank["served"][epoch]["length"] == 4 for rank in ranks
        )  # 10 images, batch 3
        assert not shards[0] & shards[1]
        assert shards[0] | shards[1] == set(range(20))
    assert ranks[0]["served"]["0"]["indices"] != ranks[0]["served"]["1"]["indices"]
    assert ranks[0]["served"]["rank0_only"]["length"] == 4  # and the run did not hang on a collective


# The CUDA stream protocol's steps are functions of gpuload/loading/pipeline.py that the deletion
# check (test_the_overlap_tests_fail_without_each_step_of_the_protocol, experiments/gpu_check.py) replaces
# with nothing, one at a time, through GPULOAD_DELETE_STEP (tests/conftest.py); each scenario of
# test_every_batch_is_exact_under_overlap should then fail:
#   "fast"/"lagging" <- `_stream_waits`: the consumer would read a batch while its copy is still in flight;
#   "slow"           <- `_record_on`: the caching allocator would give a dropped batch's memory to the next
#                       copy while the consumer's stream, far behind, has still to read it;
#   "lagging"        <- `_host_waits`: a producer would refill a pinned buffer whose copy, queued behind a
#                       sleep on its side stream, has not read it yet.
# Not run yet: no GPU has run these tests.
SLEEP_CYCLES = 20_000_000  # about 10 ms of GPU time
EPOCHS = 2
# The tests that guard the stream protocol (see the deletion check below).
PROTOCOL_TESTS = (
    "test_every_batch_is_exact_under_overlap",
    "test_a_slow_transform_on_the_side_stream_is_waited_for",
    "test_a_cuda_graph_transform_runs_in_the_consumers_thread_with_intact_batches",
)


def checksums(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[2, B]`` int64 on the current stream: per image, its pixels weighted by their position (so a
    stale, mixed or misplaced image shows) and its label."""
    pixels = images.reshape(len(images), -1).int()
    weights = torch.arange(pixels.shape[1], device=pixels.device, dtype=torch.int32) % 251 + 1
    return torch.stack([(pixels * weights).sum(1), labels])


@pytest.mark.cuda
class TestCuda:
    @pytest.fixture(scope="class")
    def data(self) -> ImageData:
        """384 random 3x256x256 images in memory: batches of 64 are 12.6 MB copies."""
        generator = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (384, 3, 256, 256), dtype=torch.uint8, generator=generator)
        return ImageData(images=images, labels=torch.arange(384), batch_size=[384])

    @pytest.mark.parametrize("lag", ["fast", "slow", "lagging"])
    def test_every_batch_is_exact_under_overlap(self, data, lag):
        loader = DataLoader(data, batch_size=64, shuffle=True, seed=3, device="cuda", threads=2)
        pool = loader._ring_pool(torch.device("cuda", torch.cuda.current_device()))
        ring = pool.take()  # the ring that every iteration below takes back from the pool
        pool.give_back(ring)
        side_streams = [ring.stream(producer) for producer in range(loader.threads)]

        def after_each_batch() -> None:
            if lag == "slow":  # the consumer's stream falls behind the host
                torch.cuda._sleep(SLEEP_CYCLES)
            elif lag == "lagging":  # the copies fall behind the gathers
                for stream in side_streams:
                    with torch.cuda.stream(stream):
                        torch.cuda._sleep(SLEEP_CYCLES)

        consumer = torch.cuda.Stream()
        sums = []
        with torch.cuda.stream(consumer):  # a consumer stream of its own, not the default one
            after_each_batch()
            for _ in range(EPOCHS):
                for images, labels in loader:  # each batch is dropped when the next arrives
                    after_each_batch()
                    sums.append(checksums(images, labels))  # kept on the device: no host sync in the loop
        torch.cuda.synchronize()
        order = torch.cat([epoch_order(len(data), epoch=epoch, seed=3, shuffle=True) for epoch in range(EPOCHS)])
        reference = checksums(data.images.cuda(), data.labels.cuda()).cpu()  # synchronous
        assert torch.equal(torch.cat(sums, dim=1).cpu(), reference[:, order])

    def test_a_slow_transform_on_the_side_stream_is_waited_for(self, data):
        """Fails if the consumer waits for the copy's event instead of the transform's (delete
        `done.record(self.stream)` and return `self.event` in _PinnedSlot.fill to see it)."""

        def slow_flip(images: torch.Tensor) -> torch.Tensor:
            torch.cuda._sleep(SLEEP_CYCLES)  # on the loader's side stream, before the flip is queued
            return images.flip(-1)

        loader = DataLoader(data, batch_size=64, shuffle=True, seed=3, device="cuda", transform=slow_flip)
        consumer = torch.cuda.Stream()
        sums = []
        with torch.cuda.stream(consumer):
            for images, labels in loader:
                sums.append(checksums(images, labels))
        torch.cuda.synchronize()
        order = epoch_order(len(data), epoch=0, seed=3, shuffle=True)
        reference = checksums(data.images.flip(-1).cuda(), data.labels.cuda()).cpu()
        assert torch.equal(torch.cat(sums, dim=1).cpu(), reference[:, order])

    @pytest.mark.parametrize("step", ["_host_waits", "_stream_waits", "_record_on", "_on_consumer_side"])
    def test_the_overlap_tests_fail_without_each_step_of_the_protocol(self, step):
        """The deletion check: each step of the stream protocol removed in turn, the tests above must
        fail (a test that still passed would not guard that step)."""
        tests = [f"tests/test_loader.py::TestCuda::{name}" for name in PROTOCOL_TESTS]
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests],
            cwd=Path(__file__).parent.parent,
            env={**os.environ, "GPULOAD_DELETE_STEP": step},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]  # 1: tests failed (not an error)
        assert re.search(r"\d+ failed", result.stdout), result.stdout[-3000:]

    def test_reserved_memory_does_not_grow_across_epochs(self, built_dataset):
        loader = DataLoader(MemmapImageDataset(built_dataset), batch_size=4, shuffle=True, device="cuda")
        reserved = []
        for _ in range(6):
            for images, labels in loader:
                (images.float().mean() + labels.sum()).item()
            torch.cuda.synchronize()
            reserved.append(torch.cuda.memory_reserved())
        assert reserved[-1] <= reserved[1]

    def test_the_ring_that_served_is_pinned_and_copied_non_blocking(self, built_dataset, host_copies):
        loader = DataLoader(MemmapImageDataset(built_dataset), batch_size=4, device="cuda", threads=1)
        iterator = iter(loader)
        ring = iterator._pipeline.ring
        images, labels = next(iterator)
        assert images.is_cuda and labels.is_cuda and host_copies
        assert all(pinned and fast for pinned, fast in host_copies)
        assert all(slot.images.is_pinned() and slot.labels.is_pinned() for slot in ring.slots)

    def test_each_producer_copies_on_a_stream_of_its_own(self, data, monkeypatch):
        streams = set()
        real = gathers_module.index_select

        def gather(*args):
            streams.add(torch.cuda.current_stream().stream_id)
            return real(*args)

        monkeypatch.setattr(gathers_module, "index_select", gather)
        loader = DataLoader(data, batch_size=16, device="cuda", threads=2, prefetch=4)
        list(loader)
        assert len(streams) == 2 and torch.cuda.default_stream().stream_id not in streams

    def test_batches_of_every_kind_are_channels_last(self, built_dataset, jpeg_dataset):
        raw, jpeg = MemmapImageDataset(built_dataset), MemmapImageDataset(jpeg_dataset)
        loaders = [
            DataLoader(raw, batch_size=4, device="cuda"),
            DataLoader(raw, batch_size=4, device="cuda", decode=RandomResizedCropDecode(16)),
            DataLoader(raw, batch_size=4, device="cuda", transform=RandomResizedCrop(16, flip=True)),
            DataLoader(jpeg, batch_size=4, device="cuda", decode=CenterCropDecode(16)),
        ]
        try:
            loaders.append(DataLoader(jpeg, batch_size=4, device="cuda", decode=CenterCropDecode(16, gpu=True)))
        except UsageError:  # no TorchCodec: that kind is tested where it is installed
            pass
        for loader in loaders:
            images, _ = next(iter(loader))
            assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last), loader

    @pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
    def test_a_loader_follows_the_device_current_when_it_iterates(self, data):
        """Made before torch.cuda.set_device(local_rank), as many training scripts do."""
        loader = DataLoader(data, batch_size=64, device="cuda")
        explicit = DataLoader(data, batch_size=64, device="cuda:1")
        previous = torch.cuda.current_device()
        try:
            torch.cuda.set_device(1)
            images, labels = next(iter(loader))
            assert images.device == labels.device == torch.device("cuda", 1)
        finally:
            torch.cuda.set_device(previous)
        images, _ = next(iter(explicit))
        assert images.device == torch.device("cuda", 1)
        assert torch.equal(images.cpu(), data.images[:64])

    def test_a_transform_compiled_with_cuda_graphs_gives_intact_batches(self, data):
        """CUDA graphs return static outputs that the next replay overwrites: the loader keeps a copy."""
        flip = torch.compile(lambda images: images.flip(-1), mode="reduce-overhead")
        loader = DataLoader(data, batch_size=64, shuffle=True, seed=3, device="cuda", transform=flip, prefetch=4)
        consumer = torch.cuda.Stream()
        sums = []
        with torch.cuda.stream(consumer):
            for images, labels in loader:
                torch.cuda._sleep(SLEEP_CYCLES)  # the consumer falls behind: later replays run first
                sums.append(checksums(images, labels))
        torch.cuda.synchronize()
        order = epoch_order(len(data), epoch=0, seed=3, shuffle=True)
        reference = checksums(data.images.flip(-1).cuda(), data.labels.cuda()).cpu()
        assert torch.equal(torch.cat(sums, dim=1).cpu(), reference[:, order])

    def test_a_cuda_graph_transform_runs_in_the_consumers_thread_with_intact_batches(self, data):
        """A captured graph's static buffers are shared by every caller and torch keeps graph state per
        thread: in two producers, one replay overwrote the other's output while the wait after the flip
        (eager: a graph break) held back its copy, and torch 2.11 failed an assertion in the thread that
        captured (seen on an H200). In the consumer's thread, each batch's replay and copy come in turn."""
        threads = []

        @torch._dynamo.disable
        def wait() -> None:
            threads.append(threading.current_thread())
            torch.cuda._sleep(SLEEP_CYCLES)

        def flip_then_wait(images: torch.Tensor) -> torch.Tensor:
            flipped = images.flip(-1)
            wait()
            return flipped

        flip = torch.compile(flip_then_wait, mode="reduce-overhead")
        assert pipeline_module.uses_cuda_graphs(flip)
        loader = DataLoader(data, batch_size=32, shuffle=True, seed=3, device="cuda", transform=flip, threads=2)
        consumer = torch.cuda.Stream()
        sums = []
        with torch.cuda.stream(consumer):
            for images, labels in loader:
                sums.append(checksums(images, labels))
        torch.cuda.synchronize()
        order = epoch_order(len(data), epoch=0, seed=3, shuffle=True)
        reference = checksums(data.images.flip(-1).cuda(), data.labels.cuda()).cpu()
        assert torch.equal(torch.cat(sums, dim=1).cpu(), reference[:, order])
        assert set(threads) == {threading.current_thread()}


class TestBlockShuffle:
    """``block_shuffle=K``: the block-aware order (see test_order.py::TestBlockOrder) through the loader."""

    def loader(self, length, *, per_block=3, window=2, **options) -> DataLoader:
        options = {"batch_size": 2, "shuffle": True, "seed": 5, "device": "cpu", "threads": 1, "prefetch": 1, **options}
        loader = DataLoader(indexed_data(length), block_shuffle=window, **options)
        loader._blocks = torch.arange(length) // per_block  # tiny images: pretend a block holds per_block of them
        return loader

    def test_local_datasets_shuffle_exactly_by_default(self):
        loader = DataLoader(indexed_data(10), batch_size=2, shuffle=True, seed=5, device="cpu")
        assert loader.block_shuffle == 0
        assert served_indices(loader) == epoch_order(10, epoch=0, seed=5, shuffle=True).tolist()

    def test_it_serves_the_block_order(self):
        with as_rank(1, 3):
            loader = self.loader(23)
            expected = epoch_order(
                23, epoch=0, seed=5, shuffle=True, rank=1, world_size=3, blocks=torch.arange(23) // 3, window=2
            )
            assert served_indices(loader) == expected.tolist() and len(loader) == 4

    @pytest.mark.parametrize(
        ("options", "error", "match"),
        [
            (
                {"block_shuffle": -1},
                ValueError,
                "block_shuffle must be 0 .exact shuffle. or a positive number of blocks, got -1",
            ),
            (
                {"block_shuffle": 2, "shuffle": False},
                ValueError,
                "block_shuffle=2 orders a shuffled epoch; pass shuffle=True",
            ),
            ({"block_shuffle": 1.5}, TypeError, "block_shuffle must be an int, got float: 1.5"),
        ],
    )
    def test_bad_arguments(self, options, error, match):
        with pytest.raises(error, match=match):
            DataLoader(indexed_data(4), **{"shuffle": True, **options})

    def test_a_state_from_before_block_shuffle_loads_as_an_exact_shuffle(self):
        loader = DataLoader(indexed_data(23), batch_size=4, shuffle=True, seed=1, device="cpu")
        old = {key: value for key, value in state(0, 8).items() if key not in ("block_shuffle", "order_world_size")}
        loader.load_state_dict(old)
        assert served_indices(loader) == epoch_order(23, epoch=0, seed=1, shuffle=True).tolist()[8:]

    def test_a_state_of_another_order_is_refused(self):
        loader = self.loader(23, window=2)
        with pytest.raises(
            ValueError, match="saved with block_shuffle=0, this loader has block_shuffle=2: another order"
        ):
            loader.load_state_dict(state(0, 8, seed=5))

    def test_a_state_of_another_block_layout_is_refused(self):
        """Same length, same window, other blocks (another block_size, a rebuilt dataset): another order,
        which would repeat some images and skip others."""
        saved = self.loader(23, per_block=3)
        next(iter(saved))
        state_then = saved.state_dict()
        assert state_then["block_layout"] != 0
        self.loader(23, per_block=3).load_state_dict(state_then)  # the same blocks: fine
        with pytest.raises(ValueError, match="saved on another layout of the dataset's blocks"):
            self.loader(23, per_block=5).load_state_dict(state_then)

    def test_the_position_may_count_the_padding_inside_the_order(self):
        with as_rank(0, 2):
            loader = self.loader(23)
            loader.load_state_dict(state(0, 24, seed=5, world_size=2, block_shuffle=2))  # 12 a rank: 24 entries
            assert served_indices(loader) == [] and loader.state_dict()["epoch"] == 1
            with pytest.raises(ValueError, match=r"global_position 25 is not in \[0, 24\]"):
                loader.load_state_dict(state(0, 25, seed=5, world_size=2, block_shuffle=2))

    def test_a_padded_order_resumed_on_fewer_ranks_serves_batches_larger_than_the_dataset(self):
        """One image, two ranks: the block order pads it to two entries. Resumed on one rank with
        batches of 2, that batch holds the image twice: more rows than the dataset, which the buffers
        (sized by what an epoch holds) must take (found by the property test below)."""
        with as_rank(0, 2):
            saved = self.loader(1, per_block=1, window=1, batch_size=1).state_dict()
        with as_rank(0, 1):
            loader = self.loader(1, per_block=1, window=1, batch_size=2)
            loader.load_state_dict(saved)
            assert labels_of(loader) == [[0, 0]]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        length=st.integers(1, 30),
        per_block=st.integers(1, 5),
        window=st.integers(1, 3),
        world_size=st.integers(1, 4),
        batch_size=st.integers(1, 5),
        new_world_size=st.integers(1, 4),
        new_batch_size=st.integers(1, 5),
        data=st.data(),
    )
    def test_interrupted_and_resumed_serves_every_sample_once(
        self, length, per_block, window, world_size, batch_size, new_world_size, new_batch_size, data
    ):
        per_rank = math.ceil(length / world_size)
        stop = data.draw(st.integers(0, math.ceil(per_rank / batch_size)), label="stop")

        def run(rank: int, world: int, batch: int, resume: dict | None, stop: int | None):
            with as_rank(rank, world):
                loader = self.loader(length, per_block=per_block, window=window, batch_size=batch)
                if resume is not None:
                    loader.load_state_dict(resume)
                loader.set_epoch(2)
                batches = loader if stop is None else (batch for _, batch in zip(range(stop), loader))
                return labels_of(batches), loader.state_dict()

        first = [run(rank, world_size, batch_size, None, stop) for rank in range(world_size)]
        saved = first[0][1]
        assert all(other == saved for _, other in first)
        assert saved["order_world_size"] == world_size
        uninterrupted = [run(rank, world_size, batch_size, None, None)[0] for rank in range(world_size)]
        assert len({len(sum(batches, [])) for batches in uninterrupted}) == 1  # the same count on every rank
        if saved["epoch"] == 3:
            resumed = [[] for _ in range(world_size)]
        else:
            resumed = [run(rank, new_world_size, new_batch_size, saved, None)[0] for rank in range(new_world_size)]
        served = sum((sum(batches, []) for batches, _ in first), []) + sum(sum(resumed, []), [])
        assert set(served) == set(range(length))
        assert len(served) <= length + (world_size - 1) + (new_world_size - 1)  # the padding, at most
        if saved["epoch"] == 3 or (new_world_size, new_batch_size) == (world_size, batch_size):
            assert [batches + rest for (batches, _), rest in zip(first, resumed)] == uninterrupted


class TestTorchDropIn:
    """What a call written for torch.utils.data.DataLoader gets: its options, a Subset (a ConcatDataset: test_concat.py)."""

    def test_num_workers_sets_the_threads_and_pin_memory_and_persistent_workers_set_nothing(self):
        stock = {"num_workers": 4, "pin_memory": True, "persistent_workers": True}
        loader = DataLoader(indexed_data(), batch_size=4, shuffle=True, seed=0, device="cpu", **stock)
        assert loader.threads == 4 and len(served_indices(loader)) == 23
        assert DataLoader(indexed_data(), num_workers=0, device="cpu").threads == 1  # torch's "main process"
        assert DataLoader(indexed_data(), num_workers=3, threads=3, device="cpu").threads == 3

    @pytest.mark.parametrize(
        "arguments, error, message",
        [
            ({"num_workers": 2, "threads": 3}, ValueError, "num_workers=2 and threads=3 both set the loader's"),
            ({"num_workers": -1}, ValueError, "num_workers must be 0 or more, got -1"),
            ({"num_workers": 2.0}, TypeError, "num_workers must be an int, got float"),
            ({"pin_memory": "yes"}, TypeError, "pin_memory must be True or False, got str: 'yes'"),
            ({"persistent_workers": 1}, TypeError, "persistent_workers must be True or False, got int: 1"),
        ],
    )
    def test_bad_torch_options_are_one_line(self, arguments, error, message):
        with pytest.raises(error, match=re.escape(message)):
            DataLoader(indexed_data(), device="cpu", **arguments)

    def test_stock_options_at_torchs_defaults_are_taken(self):
        """Code that spells out every torch argument (a config dict, DataLoader(**cfg)) passes them at their
        defaults: they ask for nothing this loader does not do."""
        defaults = {
            "batch_sampler": None, "collate_fn": None, "worker_init_fn": None, "prefetch_factor": None,
            "timeout": 0, "multiprocessing_context": None, "in_order": True, "pin_memory_device": "",
        }  # fmt: skip
        assert len(served_indices(DataLoader(indexed_data(), batch_size=4, device="cpu", **defaults))) == 23

    @pytest.mark.parametrize(
        "name, value, advice",
        [
            ("collate_fn", lambda batch: batch, "batches are gathered whole into uint8 [B, 3, H, W] and int64 [B]"),
            ("prefetch_factor", 4, "pass prefetch= (batches prepared ahead, default 3)"),
            ("multiprocessing_context", "spawn", "there are no worker processes: leave it out"),
        ],
    )
    def test_a_stock_option_it_does_not_take_says_what_to_pass(self, name, value, advice):
        with pytest.raises(UsageError) as caught:
            DataLoader(indexed_data(), device="cpu", **{name: value})
        assert str(caught.value) == (
            f"gpuload.DataLoader takes no {name} (torch.utils.data.DataLoader's): {loader_module._TORCH_ONLY[name]}"
        )
        assert advice in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(TypeError, match="DataLoader\\(\\) got an unexpected keyword argument 'shufle'"):
            DataLoader(indexed_data(), device="cpu", shufle=True)

    def test_a_stock_option_given_its_default_value_is_accepted(self):
        """A stock call that spells torch's defaults out (``collate_fn=None``, ``timeout=0``...) asks for
        nothing this loader lacks: it runs unchanged."""
        defaults = {
            "batch_sampler": None, "collate_fn": None, "worker_init_fn": None, "prefetch_factor": None,
            "timeout": 0, "multiprocessing_context": None, "in_order": True, "pin_memory_device": "",
        }  # fmt: skip
        loader = DataLoader(indexed_data(), batch_size=4, device="cpu", **defaults)
        assert [labels.tolist() for _, labels in loader] == [
            labels.tolist() for _, labels in DataLoader(indexed_data(), batch_size=4, device="cpu")
        ]
        with pytest.raises(UsageError, match="takes no timeout"):
            DataLoader(indexed_data(), device="cpu", timeout=5)

    def test_a_subset_serves_its_indices_in_its_order(self, built_dataset):
        dataset = MemmapImageDataset(built_dataset)
        subset = torch.utils.data.Subset(dataset, [7, 2, 19, 2])
        loader = DataLoader(subset, batch_size=3, device="cpu")
        batches = list(loader)
        assert [labels.tolist() for _, labels in batches] == [
            [int(dataset.targets[i]) for i in (7, 2, 19)],
            [int(dataset.targets[2])],
        ]
        assert torch.equal(batches[0][0][1], dataset[2][0]) and len(loader) == 2

    def test_a_subset_of_a_subset_and_a_sampler_of_positions_in_it(self):
        inner = torch.utils.data.Subset(indexed_data(), [20, 10, 5, 1])
        subset = torch.utils.data.Subset(inner, [3, 0, 2])  # 1, 20, 5
        assert served_indices(DataLoader(subset, batch_size=2, device="cpu")) == [1, 20, 5]
        loader = DataLoader(subset, batch_size=2, sampler=[2, 2, 0], device="cpu")
        assert served_indices(loader) == [5, 5, 1] and len(loader) == 2
        assert served_indices(DataLoader(subset, sampler=iter([1]), device="cpu")) == [20]
        with pytest.raises(TypeError, match="'float' object cannot be interpreted as an integer"):
            served_indices(DataLoader(subset, sampler=[1.5], device="cpu"))  # not truncated to 1

    def test_a_subsets_negative_indices_count_from_its_datasets_end_as_torchs_subset(self):
        """torch's ``Subset(ds, [-1])[0]`` is ``ds[-1]``; a ConcatDataset's Subset parts already took them so."""
        data = indexed_data()
        subset = torch.utils.data.Subset(data, [-1, 0, -23])
        assert served_indices(DataLoader(subset, batch_size=2, device="cpu")) == [22, 0, 0]
        assert [int(data.labels[index]) for index in subset.indices] == [22, 0, 0]  # what torch's Subset gives
        nested = torch.utils.data.Subset(torch.utils.data.Subset(data, [5, -2]), [-1])
        assert served_indices(DataLoader(nested, device="cpu")) == [21]

    @pytest.mark.parametrize(
        ("make", "message"),
        [
            (
                lambda data: DataLoader(torch.utils.data.Subset(torch.utils.data.Subset(data, [20, 10]), [0, 2])),
                r"^the Subset's indices gave position 2 in a Subset of 2 images \(positions 0 to 1\)",
            ),
            (
                lambda data: DataLoader(torch.utils.data.Subset(data, [20, 10]), sampler=[1, 2]),
                r"^the sampler gave position 2 in a Subset of 2 images \(positions 0 to 1\)",
            ),
            (
                lambda data: DataLoader(torch.utils.data.Subset(data, [20, 10]), sampler=iter([-3])),
                r"^the sampler gave position -3 in a Subset of 2 images \(positions 0 to 1\)",
            ),
        ],
    )
    def test_a_position_outside_a_subset_is_refused_in_one_line(self, make, message):
        """Not torch's "IndexError: index 2 is out of bounds for dimension 0 with size 2" from the loader's insides."""
        with pytest.raises(UsageError, match=message):
            list(make(indexed_data()))

    @pytest.mark.parametrize("indices", [[1.5, 2.0], ["1"], [True, False]])
    def test_a_subset_of_indices_that_are_not_integers_is_refused(self, indices):
        """Not truncated (1.5 served as image 1) nor read as 0/1: torch's Subset would not take them either."""
        with pytest.raises(UsageError, match=r"^a Subset's indices must be integers, got "):
            DataLoader(torch.utils.data.Subset(indexed_data(), indices), device="cpu")

    def test_a_shuffled_subset_is_refused_saying_what_subset_random_sampler_gives(self):
        subset = torch.utils.data.Subset(indexed_data(), [3, 1])
        with pytest.raises(UsageError) as caught:
            DataLoader(subset, shuffle=True, device="cpu")
        message = str(caught.value)
        assert "\n" not in message and message.startswith(
            "gpuload.DataLoader shuffles a whole dataset, got a Subset with shuffle=True: pass DataLoader("
            "subset.dataset, sampler=torch.utils.data.SubsetRandomSampler(subset.indices)) (a new permutation"
        )
        loader = DataLoader(subset.dataset, sampler=torch.utils.data.SubsetRandomSampler(subset.indices), device="cpu")
        assert sorted(served_indices(loader)) == [1, 3]  # what the message says works

    def test_a_subset_of_another_dataset_is_refused(self):
        with pytest.raises(
            TypeError,
            match="needs a Subset of a MemmapImageDataset, an ImageData or a ConcatDataset of them, got one of list",
        ):
            DataLoader(torch.utils.data.Subset([1, 2, 3], [0]), device="cpu")
