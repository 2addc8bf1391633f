import threading

import pytest
import torch

from gpuload import UsageError, default_workers, describe_machine, machine, machine_line
from gpuload.machine import limit_torch_threads, resolve_workers


def test_describes_cpu_memory_and_versions():
    machine = describe_machine()
    assert machine["cores"] == default_workers() >= 1
    assert machine["memory_gib"] > 0 and machine["cpu"]
    assert machine["torch"] and machine["python"].count(".") == 2


def test_one_line():
    machine = {"cpu": "Some CPU", "cores": 2, "memory_gib": 23.5, "gpu": None, "torch": "2.14.1"}
    assert machine_line(machine) == "Some CPU, 2 cores, 23.5 GiB, no GPU; torch 2.14.1"
    machine.update(gpu="NVIDIA H100", cuda="13.0")
    assert machine_line(machine) == "Some CPU, 2 cores, 23.5 GiB, NVIDIA H100 (CUDA 13.0); torch 2.14.1"


def test_resolve_workers():
    assert resolve_workers(None) == default_workers() and resolve_workers(3) == 3
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(UsageError, match="workers must be a positive integer"):
            resolve_workers(bad)


@pytest.mark.skipif(machine._OMP_SET_NUM_THREADS is None, reason="torch does not use OpenMP here")
@pytest.mark.parametrize("count", [1, 2, 0])
def test_limit_torch_threads_changes_only_the_calling_thread(count):
    seen = {}

    def worker():
        limit_torch_threads(count)
        seen["worker"] = torch.get_num_threads()

    def other():
        seen["other"] = torch.get_num_threads()

    before = torch.get_num_threads()
    for target in (worker, other):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen["worker"] == max(1, count)
    assert seen["other"] == before == torch.get_num_threads()
