from gpuload import default_workers, describe_machine, machine_line


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
