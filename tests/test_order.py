import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from gpuload.loading.order import distributed_rank, epoch_order


class _Sized:
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length


@pytest.mark.parametrize("length", [1, 7, 10, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_distributed_sampler(length, world_size, shuffle):
    for rank in range(world_size):
        sampler = DistributedSampler(_Sized(length), world_size, rank, shuffle=shuffle, seed=11)
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            ours = epoch_order(length, epoch=epoch, seed=11, shuffle=shuffle, rank=rank, world_size=world_size)
            assert ours.tolist() == list(sampler)


def test_shards_cover_everything_padded_to_the_same_length():
    shards = [epoch_order(10, epoch=1, seed=0, shuffle=True, rank=r, world_size=3) for r in range(3)]
    assert [len(shard) for shard in shards] == [4, 4, 4]
    flat = torch.cat(shards).tolist()
    assert set(flat) == set(range(10))  # and 2 of them twice: the padding


def test_permutation_per_epoch_reproducible_and_changing():
    first = epoch_order(50, epoch=0, seed=5, shuffle=True)
    assert sorted(first.tolist()) == list(range(50))
    assert torch.equal(first, epoch_order(50, epoch=0, seed=5, shuffle=True))
    assert not torch.equal(first, epoch_order(50, epoch=1, seed=5, shuffle=True))
    assert not torch.equal(first, epoch_order(50, epoch=0, seed=6, shuffle=True))
    assert epoch_order(4, epoch=9, seed=5, shuffle=False).tolist() == [0, 1, 2, 3]


def test_sampler_replaces_the_order_and_gets_the_epoch():
    class Sampler:
        def __init__(self):
            self.epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter([3, 1, 2])

    sampler = Sampler()
    assert epoch_order(5, epoch=4, seed=0, shuffle=True, sampler=sampler).tolist() == [3, 1, 2]
    assert sampler.epoch == 4


def test_bad_rank():
    with pytest.raises(ValueError, match="rank 2"):
        epoch_order(5, epoch=0, seed=0, shuffle=False, rank=2, world_size=2)


def test_not_distributed():
    assert distributed_rank() == (0, 1)


class TestStart:
    """``start``: the global position a resumed epoch continues from (entries of the epoch's order all ranks consumed)."""

    @pytest.mark.parametrize("length, world_size", [(10, 1), (10, 3), (7, 2), (13, 4)])
    def test_same_world_size_continues_each_distributed_sampler_shard(self, length, world_size):
        for rank in range(world_size):
            sampler = DistributedSampler(_Sized(length), world_size, rank, shuffle=True, seed=2)
            sampler.set_epoch(1)
            shard = list(sampler)
            for served in range(len(shard)):
                start = min(served * world_size, length)
                ours = epoch_order(length, epoch=1, seed=2, shuffle=True, rank=rank, world_size=world_size, start=start)
                assert ours.tolist() == shard[served:]

    def test_another_world_size_reshards_the_rest(self):
        order = epoch_order(10, epoch=0, seed=4, shuffle=True).tolist()
        shards = [epoch_order(10, epoch=0, seed=4, shuffle=True, rank=r, world_size=3, start=6) for r in range(3)]
        padded = order[6:] + order[:2]  # the rest, padded to 6 by repeating the permutation's start
        assert [shard.tolist() for shard in shards] == [padded[r::3] for r in range(3)]

    def test_at_the_end_nothing_is_left(self):
        assert epoch_order(10, epoch=0, seed=0, shuffle=True, rank=1, world_size=4, start=10).tolist() == []

    def test_a_sampler_skips_this_ranks_share(self):
        assert epoch_order(5, epoch=0, seed=0, shuffle=False, world_size=2, start=4, sampler=[4, 3, 2, 1]).tolist() == [
            2,
            1,
        ]

    @pytest.mark.parametrize("start", [-1, 11])
    def test_out_of_range(self, start):
        with pytest.raises(ValueError, match=f"start {start} is not in \\[0, 10\\]"):
            epoch_order(10, epoch=0, seed=0, shuffle=False, start=start)

    @settings(max_examples=300, deadline=None)
    @given(
        length=st.integers(0, 50),
        world_size=st.integers(1, 5),
        batch_size=st.integers(1, 8),
        stop=st.integers(0, 60),
        new_world_size=st.integers(1, 5),
        new_batch_size=st.integers(1, 8),
        shuffle=st.booleans(),
    )
    def test_interrupted_and_resumed_serves_every_sample_once(
        self, length, world_size, batch_size, stop, new_world_size, new_batch_size, shuffle
    ):
        """Ranks run ``stop`` batches in lockstep, the job stops, and resumes on ``new_world_size`` ranks
        from the global position. Every sample is served once, plus only the padding DistributedSampler
        adds; on the same world size each rank's samples are those of the uninterrupted epoch."""

        def shards(start: int, world: int) -> list[list[int]]:
            return [
                epoch_order(length, epoch=2, seed=7, shuffle=shuffle, rank=r, world_size=world, start=start).tolist()
                for r in range(world)
            ]

        uninterrupted = shards(0, world_size)
        consumed = min(stop * batch_size, len(uninterrupted[0]))  # per rank: the last batch may be short
        position = min(consumed * world_size, length)
        resumed = shards(position, new_world_size)
        served = [index for shard in uninterrupted for index in shard[:consumed]] + sum(resumed, [])
        assert set(served) == set(range(length))
        padding_before = consumed * world_size - position  # served from the uninterrupted shards' padding
        assert len(served) == length + padding_before + (-(length - position) % new_world_size)
        assert padding_before <= -length % world_size
        if new_world_size == world_size:  # whatever the new batch size: batches only cut the same sequence
            assert [shard[:consumed] + rest for shard, rest in zip(uninterrupted, resumed)] == uninterrupted
