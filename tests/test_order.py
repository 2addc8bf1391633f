import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from gpuload.loading.order import block_sequence, deal_pieces, distributed_rank, epoch_order, global_order


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


def image_blocks(length: int, per_block: int, uneven: bool) -> torch.Tensor:
    """The block each image starts in: ``per_block`` images a block, or (``uneven``) sizes that vary,
    some blocks with no image starting in them (an image larger than a block)."""
    if not uneven:
        return torch.arange(length) // per_block
    sizes = (torch.arange(length) * 7919 % 13 + 1) * per_block  # bytes in units of 1/13 of a block
    return (torch.cumsum(sizes, 0) - sizes) // 13


class TestBlockOrder:
    """The block-aware order: blocks permuted, windows of K blocks shuffled together, pieces per rank."""

    def test_windows_follow_one_another(self):
        blocks = image_blocks(200, 10, uneven=False)
        order = block_sequence(blocks, epoch=0, seed=3, window=4)
        assert sorted(order.tolist()) == list(range(200))
        runs = [set(blocks[order[i : i + 40]].tolist()) for i in range(0, 200, 40)]  # 4 blocks of 10 images
        assert all(len(run) == 4 for run in runs) and set().union(*runs) == set(range(20))
        assert order.tolist() != sorted(order.tolist())  # shuffled inside the windows

    def test_pure_function_of_seed_and_epoch(self):
        blocks = image_blocks(100, 7, uneven=True)
        first = block_sequence(blocks, epoch=2, seed=5, window=3)
        assert torch.equal(first, block_sequence(blocks, epoch=2, seed=5, window=3))
        assert not torch.equal(first, block_sequence(blocks, epoch=3, seed=5, window=3))
        assert not torch.equal(first, block_sequence(blocks, epoch=2, seed=6, window=3))

    def test_pieces_are_contiguous_and_dealt_round_robin(self):
        sequence = torch.arange(10) * 10
        dealt = deal_pieces(sequence, 3)  # pieces of 4: [0..30], [40..70], [80, 90, 0, 10]
        assert [dealt[r::3].tolist() for r in range(3)] == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90, 0, 10]]

    def test_each_rank_streams_its_own_blocks(self):
        blocks = image_blocks(400, 20, uneven=False)  # 20 blocks
        shards = [
            epoch_order(400, epoch=0, seed=1, shuffle=True, rank=r, world_size=4, blocks=blocks, window=2)
            for r in range(4)
        ]
        touched = [set(blocks[shard].tolist()) for shard in shards]
        # 100 images: 5 blocks' worth, 2.5 windows of 2 blocks, so at most 3 windows (6 blocks) of 20
        assert all(len(blocks_of_rank) <= 6 for blocks_of_rank in touched)
        assert set().union(*touched) == set(range(20)) and sum(map(len, touched)) <= 20 + 2 * 3

    def test_without_blocks_or_shuffle_it_is_the_exact_order(self):
        blocks = image_blocks(30, 4, uneven=False)
        assert torch.equal(epoch_order(30, epoch=1, seed=2, shuffle=False, blocks=blocks, window=3), torch.arange(30))
        assert torch.equal(
            global_order(30, epoch=1, seed=2, shuffle=True),
            torch.randperm(30, generator=torch.Generator().manual_seed(3)),
        )

    def test_bad_window(self):
        with pytest.raises(ValueError, match="window must be a positive int of blocks, got 0"):
            block_sequence(torch.arange(3), epoch=0, seed=0, window=0)

    @settings(max_examples=300, deadline=None)
    @given(
        length=st.integers(0, 60),
        per_block=st.integers(1, 9),
        uneven=st.booleans(),
        window=st.integers(1, 5),
        world_size=st.integers(1, 5),
        batch_size=st.integers(1, 8),
        stop=st.integers(0, 70),
        new_world_size=st.integers(1, 5),
        seed=st.integers(0, 2**40),
        epoch=st.integers(0, 100),
    )
    def test_interrupted_and_resumed_serves_every_sample_once(
        self, length, per_block, uneven, window, world_size, batch_size, stop, new_world_size, seed, epoch
    ):
        """Every index once per epoch across ranks plus at most ``W - 1`` padding, the same count on every
        rank, exact on the same world size, every index once after an elastic resume on another."""
        blocks = image_blocks(length, per_block, uneven)

        def shards(start: int, world: int) -> list[list[int]]:
            return [
                epoch_order(
                    length, epoch=epoch, seed=seed, shuffle=True, rank=r, world_size=world, start=start,
                    blocks=blocks, window=window, order_world_size=world_size,
                ).tolist()
                for r in range(world)
            ]  # fmt: skip

        uninterrupted = shards(0, world_size)
        assert len({len(shard) for shard in uninterrupted}) == 1  # equal batch counts on every rank
        everything = sum(uninterrupted, [])
        assert set(everything) == set(range(length)) and len(everything) - length == -length % world_size
        assert len(everything) - length <= world_size - 1
        consumed = min(stop * batch_size, len(uninterrupted[0]))
        position = consumed * world_size  # the padding is inside the dealt order: the position counts it
        resumed = shards(position, new_world_size)
        served = [index for shard in uninterrupted for index in shard[:consumed]] + sum(resumed, [])
        assert set(served) == set(range(length))
        assert len(served) == len(everything) + (-(len(everything) - position) % new_world_size)
        if new_world_size == world_size:
            assert [shard[:consumed] + rest for shard, rest in zip(uninterrupted, resumed)] == uninterrupted


class TestAtImageNetDensity:
    """About 40 JPEGs of ImageNet lie in a block of 4 MiB. Stored in ImageFolder's order, a window of 32
    blocks holds a few classes: about 33 distinct classes in a batch of 256, against about 226 for a
    uniform shuffle; and images across a block's end made every node fetch the next node's blocks.
    A jpeg build stores them in a seeded random order, none across a block's end."""

    CLASSES, PER_CLASS, PER_BLOCK, BATCH = 1000, 128, 40, 256

    def labels(self) -> torch.Tensor:
        return torch.arange(self.CLASSES).repeat_interleave(self.PER_CLASS)  # ImageFolder's order

    def distinct_classes(self, blocks: torch.Tensor | None) -> float:
        labels = self.labels()
        order = epoch_order(
            len(labels), epoch=0, seed=1, shuffle=True, blocks=blocks, window=32 if blocks is not None else 0
        )
        return (
            sum(labels[order[i : i + self.BATCH]].unique().numel() for i in range(0, 20 * self.BATCH, self.BATCH)) / 20
        )

    def shuffled_blocks(self) -> torch.Tensor:
        """Each image's block when the images lie in a seeded random order (the build's)."""
        count = len(self.labels())
        place = torch.empty(count, dtype=torch.int64)
        place[torch.randperm(count, generator=torch.Generator().manual_seed(0))] = torch.arange(count)
        return place // self.PER_BLOCK

    def test_a_batch_holds_nearly_as_many_classes_as_a_uniform_shuffle(self):
        uniform = self.distinct_classes(None)
        imagefolder = self.distinct_classes(torch.arange(len(self.labels())) // self.PER_BLOCK)
        shuffled = self.distinct_classes(self.shuffled_blocks())
        assert imagefolder < 0.25 * uniform  # the fault: a few dozen classes a batch
        assert shuffled >= 0.9 * uniform, (shuffled, uniform)

    @pytest.mark.parametrize(("nodes", "ranks"), [(4, 8), (2, 3)])
    def test_a_cold_epoch_downloads_each_block_about_once_across_nodes(self, nodes, ranks):
        """Each rank reads its own piece of the block sequence; the ranks of a node share a cache. With no
        image across a block's end, a node fetches the blocks of its ranks' pieces and no more: only a
        block cut between two nodes' pieces is fetched twice."""
        blocks = self.shuffled_blocks()
        world = nodes * ranks
        fetched = 0
        for node in range(nodes):
            needed = set()
            for rank in range(node * ranks, (node + 1) * ranks):
                order = epoch_order(len(blocks), epoch=0, seed=1, shuffle=True, rank=rank, world_size=world,
                                    blocks=blocks, window=32)  # fmt: skip
                needed.update(blocks[order].tolist())
            fetched += len(needed)
        assert fetched / len(blocks.unique()) <= 1.1

    def test_images_across_a_blocks_end_cost_the_next_nodes_blocks(self):
        """Why no image may cross a block's end: with each image also needing the next block, 4 nodes of
        8 ranks fetch far more than the dataset."""
        blocks = self.shuffled_blocks()
        fetched = 0
        for node in range(4):
            needed = set()
            for rank in range(node * 8, (node + 1) * 8):
                order = epoch_order(len(blocks), epoch=0, seed=1, shuffle=True, rank=rank, world_size=32,
                                    blocks=blocks, window=32)  # fmt: skip
                needed.update(blocks[order].tolist())
                needed.update((blocks[order] + 1).tolist())  # the image goes on into the next block
            fetched += len(needed)
        assert fetched / len(blocks.unique()) > 1.5
