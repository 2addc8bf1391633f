"""Named fields (gpuload.format.fields, gpuload.format.columns, gpuload.loading.fields): what the manifest
records, what ds[i], gpuload.DataLoader and torch's DataLoader serve, at a URL too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import photo_rows
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from gpuload import CenterCropDecode, DataLoader, DatasetError, MemmapImageDataset, build_memmap
from gpuload.format.columns import FieldColumn
from gpuload.format.fields import FieldSpec
from gpuload.format.manifest import Manifest
from gpuload.remote.push import push_memmap


def values(batch: dict, name: str) -> list:
    value = batch[name]
    return value.tolist() if isinstance(value, torch.Tensor) else list(value)


class TestSpec:
    @pytest.mark.parametrize(
        ("entry", "message"),
        [
            ({"name": "9x", "kind": "number", "dtype": "int64", "shape": []}, "not a name of letters"),
            ({"name": "label", "kind": "number", "dtype": "int64", "shape": []}, "not a name of letters"),
            ({"name": "x", "kind": "box", "dtype": "uint8", "shape": []}, "has kind 'box', not one of"),
            ({"name": "x", "kind": "mask", "dtype": "uint8", "shape": [4]}, "cannot have dtype 'uint8' and shape"),
            ({"name": "x", "kind": "number", "dtype": "int8", "shape": []}, "cannot have dtype 'int8'"),
            ({"name": "x", "kind": "number", "dtype": "int64", "shape": [2, 2]}, "cannot have dtype 'int64' and shape"),
            ({"name": "x", "kind": "text", "dtype": "str", "shape": [], "classes": []}, "has the keys"),
            ({"name": "x", "kind": "multilabel", "dtype": "float32", "shape": [2], "classes": ["a"]}, "2 distinct"),
        ],
    )
    def test_a_bad_entry_says_what_is_wrong(self, entry, message):
        with pytest.raises(ValueError, match=message):
            FieldSpec.from_json(entry)

    def test_a_manifest_with_a_bad_field_is_refused_at_open(self, fields_dataset, tmp_path):
        copy = Path(shutil.copytree(fields_dataset, tmp_path / "copy"))
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["fields"][0]["dtype"] = "int8"
        (copy / "manifest.json").chmod(0o644)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DatasetError, match="fields"):
            MemmapImageDataset(copy)

    def test_damaged_offsets_are_refused_at_open(self, fields_dataset, tmp_path):
        copy = Path(shutil.copytree(fields_dataset, tmp_path / "copy"))
        offsets = copy / "fields" / "caption.offsets.memmap"
        offsets.chmod(0o644)
        data = np.fromfile(offsets, dtype="<i8")
        data[-1] += 1
        data.tofile(offsets)
        with pytest.raises(DatasetError, match="fields/caption.offsets.memmap does not cut fields/caption.memmap"):
            MemmapImageDataset(copy)

    def test_plain_tensordict_opens_the_numbers(self, fields_dataset, table_folder):
        data = TensorDict.load_memmap(fields_dataset)
        rows = photo_rows(table_folder)
        assert data["fields", "boxes"].tolist() == [row["boxes"] for row in rows]
        assert data["fields", "score"].tolist() == [row["score"] for row in rows]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=5), min_size=1, max_size=20), st.data())
def test_multilabel_is_served_multi_hot(sets, data):
    flat = np.array([index for indices in sets for index in sorted(set(indices))], dtype=np.int32)
    offsets = np.cumsum([0, *(len(set(indices)) for indices in sets)]).astype(np.int64)
    spec = FieldSpec("tags", "multilabel", "float32", (5,), tuple("abcde"))
    column = FieldColumn(spec, {"data": flat, "offsets": offsets}, len(sets))
    column.check("here")
    picked = data.draw(st.lists(st.integers(0, len(sets) - 1), min_size=1, max_size=10))
    batch = column.batch(torch.tensor(picked))
    expected = [[float(index in sets[position]) for index in range(5)] for position in picked]
    assert batch.tolist() == expected and column.sample(picked[0]).tolist() == expected[0]


class TestServing:
    def test_the_loader_batches_every_field(self, fields_dataset):
        ds = MemmapImageDataset(fields_dataset)
        loader = DataLoader(ds, batch_size=6, shuffle=True, device="cpu")
        seen = []
        for batch in loader:
            assert sorted(batch) == ["boxes", "caption", "image", "label", "score", "tags"]
            assert batch["boxes"].dtype == torch.int64 and batch["tags"].dtype == torch.float32
            labels = batch["label"].tolist()
            for row, caption in enumerate(batch["caption"]):
                position = next(i for i in range(len(ds)) if ds[i]["caption"] == caption)
                sample = ds[position]
                assert labels[row] == sample["label"] and torch.equal(batch["image"][row], sample["image"])
                assert batch["score"][row] == sample["score"] and torch.equal(batch["tags"][row], sample["tags"])
                assert torch.equal(batch["boxes"][row], sample["boxes"])
                seen.append(position)
        assert sorted(seen) == list(range(len(ds)))

    @pytest.mark.cuda
    def test_numbers_go_through_the_pinned_ring_to_the_gpu(self, fields_dataset):
        ds = MemmapImageDataset(fields_dataset)
        on_host = list(DataLoader(ds, batch_size=6, shuffle=True, seed=2, device="cpu"))
        on_gpu = list(DataLoader(ds, batch_size=6, shuffle=True, seed=2, device="cuda"))
        for here, there in zip(on_host, on_gpu, strict=True):
            assert there["score"].is_cuda and there["tags"].is_cuda and isinstance(there["caption"], list)
            for name in ("image", "label", "score", "boxes", "tags"):
                assert torch.equal(here[name], there[name].cpu()), name
            assert here["caption"] == there["caption"]

    def test_exact_resume_with_fields(self, fields_dataset):
        ds = MemmapImageDataset(fields_dataset)
        loader = DataLoader(ds, batch_size=3, shuffle=True, seed=4, device="cpu")
        iterator = iter(loader)
        first = [values(batch, "caption") for _, batch in zip(range(2), iterator)]
        saved = loader.state_dict()
        rest = [values(batch, "caption") for batch in iterator]
        again = DataLoader(ds, batch_size=3, shuffle=True, seed=4, device="cpu")
        again.load_state_dict(saved)
        assert [values(batch, "caption") for batch in again] == rest and len(first) == 2

    def test_a_jpeg_dataset_with_decode_time_crops(self, table_folder, tmp_path):
        ds = MemmapImageDataset(build_memmap(table_folder, tmp_path / "out", format="jpeg", progress=False))
        batch = next(iter(DataLoader(ds, batch_size=4, decode=CenterCropDecode(32), device="cpu")))
        assert batch["image"].shape == (4, 3, 32, 32) and batch["score"].tolist() == [0, 0.25, 0.5, 0.75]

    def test_torch_dataloader_collates_the_same_dict(self, fields_dataset):
        ds = MemmapImageDataset(fields_dataset)
        batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=5)))
        ours = next(iter(DataLoader(ds, batch_size=5, device="cpu")))
        assert sorted(batch) == sorted(ours)
        for name in batch:
            assert values(batch, name) == values(ours, name), name
        two = next(iter(torch.utils.data.DataLoader(ds, batch_size=5, num_workers=1)))
        assert values(two, "caption") == values(ours, "caption")

    def test_pushed_and_opened_at_a_url(self, fields_dataset, tmp_path):
        url = (tmp_path / "bucket" / "fields.memmap").as_uri()
        push_memmap(fields_dataset, url, progress=False)
        local = MemmapImageDataset(fields_dataset)
        for cache in (None, tmp_path / "cache"):
            options = {} if cache is None else {"cache": cache, "cache_size": "50MB"}
            remote = MemmapImageDataset(url, **options)
            try:
                for position in (0, 11):
                    here, there = local[position], remote[position]
                    assert torch.equal(here["image"], there["image"]) and here["caption"] == there["caption"]
                    assert torch.equal(here["tags"], there["tags"]) and torch.equal(here["boxes"], there["boxes"])
                batch = next(iter(DataLoader(remote, batch_size=4, device="cpu")))
                assert batch["caption"] == [local[position]["caption"] for position in range(4)]
            finally:
                remote.close()
        assert Manifest.read(fields_dataset).index_files()[-1] == "fields/caption.offsets.memmap"
