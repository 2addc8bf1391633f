"""Run by test_loader.py under ``torchrun --nproc_per_node 2``: each rank writes which images it was served."""

import json
import os
import sys

import torch
import torch.distributed as dist

import gpuload


def main(dataset_path: str, out: str) -> None:
    dist.init_process_group("gloo")
    dataset = gpuload.MemmapImageDataset(dataset_path)
    index_of = {dataset.data.images[i].numpy().tobytes(): i for i in range(len(dataset))}
    loader = gpuload.DataLoader(dataset, batch_size=3, shuffle=True, seed=4, device="cpu")
    served = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        served[epoch] = {
            "length": len(loader),
            "indices": [index_of[image.numpy().tobytes()] for images, _ in loader for image in images],
        }
    torch.manual_seed(dist.get_rank())  # ranks seeded differently, no seed given: rank 0's draw decides
    unseeded = gpuload.DataLoader(dataset, batch_size=3, shuffle=True, device="cpu")
    served["unseeded"] = {
        "length": len(unseeded),
        "indices": [index_of[image.numpy().tobytes()] for images, _ in unseeded for image in images],
    }
    if dist.get_rank() == 0:  # a validation loader on rank 0 only, unshuffled and unseeded: no collective
        served["rank0_only"] = {"length": len(gpuload.DataLoader(dataset, batch_size=3, device="cpu"))}
    dist.barrier()
    with open(f"{out}/rank{dist.get_rank()}.json", "w") as file:
        json.dump({"world_size": dist.get_world_size(), "served": served}, file)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: in one CI run of about ten a rank died with
    # "terminate called without an active exception" (SIGABRT) and no Python traceback, which we
    # read as the known abort of gloo's threads at interpreter finalization (pytorch/pytorch#179291);
    # a death before this line still fails the test.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
