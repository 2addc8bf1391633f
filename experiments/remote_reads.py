"""Reading a dataset object from S3: which client, which block size, and does the object's size matter?

Everything runs on this machine, on 127.0.0.1: the tests' Range HTTP server answering S3 clients'
GET and HEAD (path-style ``/bucket/key``) with a fixed latency added to every request (a remote
store's round trip), and moto's S3 server. moto serves about 45 requests per second here and copies
the whole object for every ranged GET, so it would rank the server, not the clients: it serves only
question 3. Three questions, each contender in the same run:

1. **Client**: obstore (Rust ``object_store``) against s3fs (aiobotocore), both through
   :class:`gpuload.remote.file.RemoteFile` (its threads, ``If-Match`` on every GET), fetching
   distinct aligned blocks of 1, 4 and 16 MiB, drawn at random from an object as large as the budget
   (so every block is read once, in a random order), one request a block, 16 requests in flight,
   without and with added latency; rates are the bytes the client fetched over the time.
2. **Small ranges** (image-sized, 48 KB, random): requests per second for each client, and obstore's
   own ``get_ranges`` (one call, no ``If-Match``) for reference.
3. **Object size**: the time of one 4 MiB ranged GET from a 16 MiB and from a 512 MiB object, on
   moto and on the Range HTTP server: whether splitting data objects into parts would serve reads.

Numbers are loopback numbers on a shared 2-core VM: the servers (Python) share the cores with the
client, so they rank the contenders, not the network.

    python -m experiments.remote_reads            # writes assets/results/remote_reads.json
    python -m experiments.remote_reads --quick    # tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments._common import ROOT, add_device_argument, write_result

sys.path.insert(0, str(ROOT / "tests"))
from servers import RangeHTTPServer, S3Server, fake_aws_environment  # noqa: E402

from gpuload.remote.file import RemoteFile  # noqa: E402
from gpuload.remote.store import Retry, open_store  # noqa: E402

MiB = 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=25.0, help="added to every request (default: 25)")
    parser.add_argument(
        "--budget-mib", type=int, default=256, help="bytes fetched per contender and repeat (default: 256)"
    )
    parser.add_argument("--plot-only", action="store_true", help="(no plot: the README's table is the result)")
    add_device_argument(parser)  # accepted for experiments.run; nothing here runs on a GPU
    args = parser.parse_args(argv)
    if args.plot_only:
        return
    saved = dict(os.environ)
    try:
        _measure(args)
    finally:  # the fake AWS variables stay out of the experiments that run after this one
        os.environ.clear()
        os.environ.update(saved)


def _measure(args) -> None:
    repeats = 1 if args.quick else args.repeats
    budget = 8 * MiB if args.quick else args.budget_mib * MiB
    block_sizes = [1 * MiB, 4 * MiB] if args.quick else [1 * MiB, 4 * MiB, 16 * MiB]
    # at least as large as what a contender reads (the budget, or one block): no block is drawn twice
    object_bytes = -(-budget // max(block_sizes)) * max(block_sizes)
    latencies = [0.0, args.latency_ms / 1000]
    rng = random.Random(0)
    payload = np.random.default_rng(0).bytes(object_bytes)  # random.randbytes overflows past 256 MiB
    results: dict = {"blocks": [], "small_ranges": [], "object_size": []}
    with tempfile.TemporaryDirectory() as tmp, S3Server() as s3, RangeHTTPServer(tmp) as web:
        os.environ.update(fake_aws_environment(web.url))
        bucket = "bench"
        (Path(tmp) / bucket / "ds").mkdir(parents=True)
        (Path(tmp) / bucket / "ds" / "data.memmap").write_bytes(payload)
        url = f"s3://{bucket}/ds"
        stores = {name: open_store(url, backend=name, retry=Retry()) for name in ("obstore", "fsspec")}
        for latency in latencies:
            web.latency = latency
            for block in block_sizes:
                count = max(1, budget // block)
                for name, store in stores.items():
                    runs = [read_blocks(store, "data.memmap", block, count, rng) for _ in range(repeats)]
                    seconds = [run["seconds"] for run in runs]
                    row = {
                        "client": "obstore" if name == "obstore" else "s3fs",
                        "latency_ms": latency * 1000,
                        "block_MiB": block / MiB,
                        "blocks": count,
                        "requests": [run["requests"] for run in runs],
                        "bytes_fetched": [run["bytes_fetched"] for run in runs],
                        "seconds": seconds,
                        "MB_per_s": statistics.median(run["bytes_fetched"] / run["seconds"] for run in runs) / 1e6,
                        "requests_per_s": statistics.median(run["requests"] / run["seconds"] for run in runs),
                    }
                    results["blocks"].append(row)
                    print(f"blocks  {row['client']:8} {row['latency_ms']:4.0f} ms  {row['block_MiB']:4.0f} MiB  "
                          f"{row['MB_per_s']:7.1f} MB/s  {row['requests_per_s']:6.1f} req/s", flush=True)  # fmt: skip
            small = 48_000
            count = 64 if args.quick else 256
            for name, store in [*stores.items(), ("obstore get_ranges", None)]:
                seconds = []
                for _ in range(repeats):
                    starts = [rng.randrange(object_bytes - small) for _ in range(count)]
                    started = time.perf_counter()
                    if store is None:
                        import obstore

                        raw = stores["obstore"]._store
                        obstore.get_ranges(raw, "data.memmap", starts=starts, lengths=[small] * count)
                    else:
                        # no cache, block_size 1: no two ranges merged, one request each
                        with RemoteFile(store, "data.memmap", block_size=1, workers=16) as file:
                            file.read_many([(start, small) for start in starts])
                    seconds.append(time.perf_counter() - started)
                best = statistics.median(seconds)
                row = {
                    "client": {"obstore": "obstore", "fsspec": "s3fs"}.get(name, name),
                    "latency_ms": latency * 1000,
                    "range_bytes": small,
                    "ranges": count,
                    "seconds": seconds,
                    "ranges_per_s": count / best,
                }
                results["small_ranges"].append(row)
                print(
                    f"small   {row['client']:20} {row['latency_ms']:4.0f} ms  {row['ranges_per_s']:7.1f} ranges/s",
                    flush=True,
                )
        web.latency = 0.0
        os.environ.update(fake_aws_environment(s3.endpoint))
        moto_store = open_store(f"s3://{s3.bucket()}/ds", backend="obstore")
        results["object_size"] = _object_sizes(s3, moto_store, tmp, quick=args.quick, repeats=repeats)
    write_result(
        "remote_reads",
        {
            "device": "cpu",
            "latency_ms": args.latency_ms,
            "budget_MiB": budget / MiB,
            "object_MiB": object_bytes / MiB,
            "repeats": repeats,
            "quick": args.quick,
            "servers": "the tests' Range HTTP server as a path-style S3 GET/HEAD endpoint (blocks, small ranges) and "
            "moto[server] S3 (object size), on 127.0.0.1",
            **results,
        },
    )


def read_blocks(store, name: str, block: int, count: int, rng: random.Random) -> dict:
    """``count`` distinct aligned blocks of ``block`` bytes of the object ``name``, drawn with ``rng``, read
    through :class:`RemoteFile` (one request a block, 16 in flight): the seconds, and the requests and bytes
    that the client fetched.

    Raises:
        ValueError: the object holds fewer than ``count`` blocks.
    """
    with RemoteFile(store, name, block_size=block, blocks_per_request=1, workers=16) as file:
        if count > file.size // block:
            raise ValueError(
                f"{name} holds {file.size // block} blocks of {block:,} bytes, fewer than the {count} to read once each"
            )
        starts = [index * block for index in rng.sample(range(file.size // block), count)]
        started = time.perf_counter()
        file.read_many([(start, block) for start in starts])
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "requests": file.stats["requests"], "bytes_fetched": file.stats["bytes_fetched"]}


def _object_sizes(s3: S3Server, store, tmp: str, *, quick: bool, repeats: int) -> list[dict]:
    """One 4 MiB ranged GET from objects of several sizes, on moto and on the Range HTTP server."""
    sizes = [16 * MiB, 64 * MiB] if quick else [16 * MiB, 512 * MiB]
    rows = []
    folder = Path(tmp) / "objects"
    folder.mkdir()
    with RangeHTTPServer(tmp) as web:
        for size in sizes:
            name = f"object-{size // MiB}.bin"
            data = os.urandom(size)
            bucket = store.url.split("/")[2]
            s3.client().put_object(Bucket=bucket, Key=f"ds/{name}", Body=data)
            (folder / name).write_bytes(data)
            del data
            for server, target in (("moto", store), ("http", open_store(f"{web.url}/objects"))):
                info = target.info(name)
                times = []
                for _ in range(5 * repeats):
                    start = random.randrange(size // (4 * MiB)) * 4 * MiB
                    started = time.perf_counter()
                    target.read(name, start, 4 * MiB, info)
                    times.append(time.perf_counter() - started)
                row = {"server": server, "object_MiB": size // MiB, "ms_per_4MiB_get": statistics.median(times) * 1000}
                rows.append(row)
                print(
                    f"object  {server:5} {row['object_MiB']:4d} MiB  {row['ms_per_4MiB_get']:7.1f} ms per 4 MiB GET",
                    flush=True,
                )
            s3.client().delete_object(Bucket=bucket, Key=f"ds/{name}")
            (folder / name).unlink()
    return rows


if __name__ == "__main__":
    main()
