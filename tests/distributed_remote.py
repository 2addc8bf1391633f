"""Run by test_remote_dataset.py under torchrun (gloo): ranks on simulated nodes read a dataset at a URL.

Every two consecutive ranks are one "node": they share a cache folder and reach the S3 server
through their node's own proxy (so each proxy records one node's downloads). ``run`` (4 ranks): a whole
epoch 0, then 2 batches of epoch 1 and rank 0 saves the loader's state; ``resume`` (any world size):
the rest of epoch 1 from that state. Each rank writes which images it was served.
"""

import json
import os
import sys

import torch.distributed as dist

import gpuload


def main(url: str, local: str, cache_root: str, endpoints: str, mode: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    node = rank // 2 if mode == "run" else rank
    endpoint = endpoints.split(",")[node]
    os.environ["AWS_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
    dataset = gpuload.MemmapImageDataset(url, cache=f"{cache_root}/node{node}", cache_size="50MB", block_size=32768)
    reference = gpuload.MemmapImageDataset(local)
    index_of = {reference.data.images[i].numpy().tobytes(): i for i in range(len(reference))}
    loader = gpuload.DataLoader(dataset, batch_size=2, shuffle=True, seed=3, device="cpu", block_shuffle=1)

    def indices(batches) -> list[int]:
        return [index_of[image.numpy().tobytes()] for images, _ in batches for image in images]

    served = {}
    if mode == "run":
        served["epoch0"] = {"length": len(loader), "indices": indices(loader)}
        loader.set_epoch(1)
        iterator = iter(loader)
        served["epoch1_start"] = {"indices": indices(next(iterator) for _ in range(2))}
        del iterator
        if rank == 0:
            with open(f"{out}/state.json", "w") as file:
                json.dump(loader.state_dict(), file)
    else:
        with open(f"{out}/state.json") as file:
            loader.load_state_dict(json.load(file))
        served["epoch1_rest"] = {"indices": indices(loader)}
    dataset.close()
    dist.barrier()
    with open(f"{out}/{mode}{rank}.json", "w") as file:
        json.dump({"world_size": world_size, "served": served, "stats": dataset.image_file.stats}, file)
    dist.destroy_process_group()
    os._exit(0)  # as distributed_shards.py: no interpreter teardown with gloo's threads


if __name__ == "__main__":
    main(*sys.argv[1:])
