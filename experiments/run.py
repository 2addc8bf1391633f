"""Run every experiment: ``python -m experiments.run [--quick] [--device cpu|cuda|auto]``.

``--quick``: tiny sizes, a smoke test. ``--device`` (default ``auto``: cuda when a GPU is there)
goes to every experiment, so the whole GPU run is one command on a GPU machine.

The build benchmark (``experiments.build_memmap``) is not part of it: it needs thousands of photos
and a quiet machine; run it on its own.
"""

from __future__ import annotations

import argparse
import time

from . import gpu_preprocess, jpeg_quality, jpeg_store, memmap_vs_folder, train_augment, train_order, transfer_order
from ._common import add_device_argument

EXPERIMENTS = {
    "transfer_order": transfer_order,
    "train_order": train_order,
    "jpeg_quality": jpeg_quality,
    "memmap_vs_folder": memmap_vs_folder,
    "gpu_preprocess": gpu_preprocess,
    "train_augment": train_augment,
    "jpeg_store": jpeg_store,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    parser.add_argument("--plot-only", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    for name in args.only:
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        flags = ["--quick"] * args.quick + ["--plot-only"] * args.plot_only + ["--device", args.device]
        EXPERIMENTS[name].main(flags)
        print(f"== {name} done in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
