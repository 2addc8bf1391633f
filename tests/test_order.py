import pytest
import torch
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
