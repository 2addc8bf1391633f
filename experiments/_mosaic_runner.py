"""MosaicML Streaming's side of ``experiments.remote_loading``, run in a virtual environment of its own.

mosaicml-streaming 0.13 pins ``numpy<2.2``, which the project's environment does not take, so
``remote_loading`` runs this file with another interpreter (``--mosaic-python``): it imports only
streaming, torch and torchvision, never gpuload. Two commands, each printing one JSON line:

    python -m experiments._mosaic_runner write SRC_LIST_JSON OUT     # MDS shards of the same JPEG bytes
    python -m experiments._mosaic_runner read REMOTE LOCAL EPOCHS BATCH WORKERS   # epochs from s3://
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time


def cpu_seconds(exclude: set[int] = frozenset()) -> float:
    """CPU time of this process, its reaped children and its live descendants (not ``exclude``)."""
    ticks = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> list[str]:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()

    own = stat(os.getpid())
    total = sum(int(value) for value in own[11:15])  # utime, stime, cutime, cstime
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            children = []
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as file:
                    children += [int(child) for child in file.read().split()]
        except OSError:
            continue
        for child in children:
            if child in exclude:
                continue
            try:
                total += sum(int(value) for value in stat(child)[11:13])
            except OSError:
                continue
            todo.append(child)
    return total / ticks


def write(sources: str, out: str) -> None:
    from streaming import MDSWriter

    with open(sources) as file:
        samples = json.load(file)
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit=16 * 2**20) as writer:
        for path, label in samples:
            with open(path, "rb") as image:
                writer.write({"image": image.read(), "label": label})
    print(json.dumps({"written": len(samples)}))


if importlib.util.find_spec("streaming") is not None:  # in the interpreter that has it (workers import this class)
    from streaming import StreamingDataset

    class Photos(StreamingDataset):
        """The MDS samples, decoded and augmented as the other stock contenders do, in the workers."""

        def __getitem__(self, index):
            import torch
            from torchvision.io import decode_jpeg
            from torchvision.transforms import v2

            if not hasattr(self, "_augment"):
                self._augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
            sample = super().__getitem__(index)
            image = decode_jpeg(torch.frombuffer(bytearray(sample["image"]), dtype=torch.uint8))
            return self._augment(image), sample["label"]


def read(remote: str, local: str, epochs: str, batch_size: str, workers: str) -> None:
    import torch
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # what an earlier run that died left in /dev/shm (mosaicml/streaming#824)
    torch.set_num_threads(1)
    rows = []
    started = time.perf_counter()
    cpu = cpu_seconds()
    dataset = Photos(remote=remote, local=local, shuffle=True, shuffle_seed=0, batch_size=int(batch_size))
    opened = time.perf_counter() - started
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=int(batch_size),
        num_workers=int(workers),
        persistent_workers=True,
        multiprocessing_context="forkserver",
    )
    for epoch in range(int(epochs)):
        images = 0
        started, cpu = time.perf_counter(), cpu_seconds()
        first, first_images = None, 0
        for batch, _ in loader:
            if first is None:
                first, first_images = time.perf_counter() - started, len(batch)
            images += len(batch)
        seconds = time.perf_counter() - started
        rows.append(
            {
                "epoch": epoch,
                "images": images,
                "seconds": seconds,
                "first_batch_s": first,
                "first_images": first_images,
                "open_s": opened if epoch == 0 else 0.0,
                "cpu_s": cpu_seconds() - cpu,
            }
        )
    print(json.dumps({"epochs": rows}))


if __name__ == "__main__":
    from experiments._mosaic_runner import read, write  # Photos by its importable name, for the workers

    {"write": write, "read": read}[sys.argv[1]](*sys.argv[2:])
