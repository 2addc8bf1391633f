"""Images named by a metadata table (gpuload.sources.metadata): Hugging Face's imagefolder convention."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TAGS, open_files, photo_rows, write_jsonl

from gpuload import MemmapImageDataset, SourceError, UsageError, build_memmap, verify_memmap
from gpuload.cli import main


@pytest.fixture
def table_copy(table_folder, tmp_path) -> Path:
    """A copy of ``table_folder`` that a test may change."""
    return Path(shutil.copytree(table_folder, tmp_path / "photos"))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


class TestMetadataJsonl:
    def test_every_column_becomes_a_field_of_its_kind(self, fields_dataset, table_folder):
        ds = MemmapImageDataset(fields_dataset)
        rows = photo_rows(table_folder)
        assert ds.manifest.source_format == "table" and len(ds) == len(rows)
        assert [spec.to_json() for spec in ds.manifest.field_specs] == [
            {"name": "score", "kind": "number", "dtype": "float32", "shape": []},
            {"name": "boxes", "kind": "number", "dtype": "int64", "shape": [4]},
            {"name": "tags", "kind": "multilabel", "dtype": "float32", "shape": [3], "classes": sorted(TAGS)},
            {"name": "caption", "kind": "text", "dtype": "str", "shape": []},
        ]
        for position in (0, 7, len(rows) - 1):
            sample, row = ds[position], rows[position]
            assert sorted(sample) == ["boxes", "caption", "image", "label", "score", "tags"]
            assert ds.classes[sample["label"]] == row["label"]
            assert sample["score"].item() == row["score"] and sample["boxes"].tolist() == row["boxes"]
            assert sample["tags"].tolist() == [float(name in row["tags"]) for name in sorted(TAGS)]
            assert sample["caption"] == row["caption"]

    def test_the_images_are_the_image_folder_builds(self, fields_dataset, built_dataset):
        ds, plain = MemmapImageDataset(fields_dataset), MemmapImageDataset(built_dataset)
        assert ds.classes == plain.classes and len(ds) == len(plain)
        assert torch.equal(ds.data.images, plain.data.images) and torch.equal(ds.data.labels, plain.data.labels)
        assert isinstance(plain[0], tuple)  # an ImageFolder's dataset keeps its (image, label) pairs

    def test_verify_checks_every_field(self, fields_dataset, tmp_path):
        assert verify_memmap(fields_dataset, sources="all", progress=False) == []
        damaged = Path(shutil.copytree(fields_dataset, tmp_path / "damaged"))
        path = damaged / "fields" / "caption.memmap"
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[3] ^= 1
        path.write_bytes(bytes(data))
        assert verify_memmap(damaged, progress=False) == [
            "fields/caption.memmap differs from what was built (its digest differs): each image's value of the "
            "field 'caption' is damaged; rebuild the dataset"
        ]

    def test_no_label_column_takes_the_class_from_the_folder(self, table_copy, tmp_path):
        rows = [{key: value for key, value in row.items() if key != "label"} for row in photo_rows(table_copy)]
        write_jsonl(table_copy / "metadata.jsonl", rows)
        ds = MemmapImageDataset(build_memmap(table_copy, tmp_path / "out", progress=False))
        assert ds.classes == sorted({row["file_name"].split("/")[0] for row in rows})

    def test_labels_as_indices(self, table_copy, tmp_path):
        rows = [row | {"label": position % 3} for position, row in enumerate(photo_rows(table_copy))]
        write_jsonl(table_copy / "metadata.jsonl", rows)
        ds = MemmapImageDataset(build_memmap(table_copy, tmp_path / "out", progress=False))
        assert ds.classes == ["0", "1", "2"] and ds.data.labels.tolist() == [row["label"] for row in rows]


class TestOtherTables:
    def test_a_csv_given_by_its_path_with_roles(self, table_copy, tmp_path):
        rows = photo_rows(table_copy)
        (table_copy / "metadata.jsonl").unlink()
        lines = ["path,kind,score,boxes,tags,caption"]
        for row in rows:
            tags = json.dumps(row["tags"]).replace('"', '""')
            lines.append(f'{row["file_name"]},{row["label"]},{row["score"]},"{row["boxes"]}","{tags}",{row["caption"]}')
        (table_copy / "labels.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        out = build_memmap(
            table_copy / "labels.csv",
            tmp_path / "out",
            columns={"path": "image", "kind": "label", "caption": "text", "score": "ignore"},
            progress=False,
        )
        ds = MemmapImageDataset(out)
        assert [spec.name for spec in ds.manifest.field_specs] == ["boxes", "tags", "caption"]
        assert ds[5]["caption"] == rows[5]["caption"] and ds[5]["boxes"].tolist() == rows[5]["boxes"]

    def test_csv_cells_read_as_numbers_bools_and_lists(self, table_copy, tmp_path):
        rows = photo_rows(table_copy)
        (table_copy / "metadata.jsonl").unlink()
        lines = ["file_name,flag,size,ratio"] + [
            f'{row["file_name"]},{"True" if position % 2 else "false"},{position},"[{position}, 0.5]"'
            for position, row in enumerate(rows)
        ]
        (table_copy / "metadata.csv").write_text("\n".join(lines) + "\n")
        ds = MemmapImageDataset(build_memmap(table_copy, tmp_path / "out", progress=False))
        assert [(spec.name, spec.dtype, spec.shape) for spec in ds.manifest.field_specs] == [
            ("flag", "bool", ()),
            ("size", "int64", ()),
            ("ratio", "float32", (2,)),
        ]
        assert ds[3]["flag"].item() is True and ds[4]["flag"].item() is False and ds[3]["ratio"].tolist() == [3, 0.5]

    def test_zero_padded_labels_in_a_csv_are_class_names(self, photo_folder, tmp_path):
        """Class folders ``001``, ``002``... (CUB, many 1-based datasets) written as a CSV's labels are the
        names an ImageFolder of them has, not the indices 1, 2...: the same classes and labels as the folder's
        build, and ``--classes-from`` that build maps each to its own class."""
        folder = tmp_path / "padded"
        for position, name in enumerate(sorted(path.name for path in photo_folder.iterdir())):
            shutil.copytree(photo_folder / name, folder / f"{position + 1:03d}")
        plain = MemmapImageDataset(build_memmap(folder, tmp_path / "plain", progress=False))
        files = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*.jpg"))
        lines = ["file_name,label,count"] + [
            f"{name},{name.split('/')[0]},{position:03d}" for position, name in enumerate(files)
        ]
        (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
        table = MemmapImageDataset(build_memmap(folder, tmp_path / "table", progress=False))
        assert table.classes == plain.classes == [f"{position + 1:03d}" for position in range(len(plain.classes))]
        assert torch.equal(table.data.labels, plain.data.labels)
        given = MemmapImageDataset(build_memmap(folder, tmp_path / "given", classes=plain.classes, progress=False))
        assert torch.equal(given.data.labels, plain.data.labels)
        assert table[7]["count"].item() == 7  # a field's zero-padded integers stay numbers

    def test_metadata_parquet_naming_files(self, table_copy, tmp_path):
        rows = photo_rows(table_copy)
        (table_copy / "metadata.jsonl").unlink()
        pq.write_table(pa.Table.from_pylist(rows), table_copy / "metadata.parquet")
        ds = MemmapImageDataset(build_memmap(table_copy, tmp_path / "out", format="jpeg", progress=False))
        assert ds.manifest.source_format == "table" and ds[3]["tags"].sum() == len(set(rows[3]["tags"]))

    def test_the_command_line_takes_roles(self, capsys, table_copy, tmp_path):
        code = main(["build-memmap", str(table_copy), "--out", str(tmp_path / "out"), "--column", "caption=ignore"])
        assert code == 0 and "\nfields: score: number float32; boxes: number int64 [4]; tags: multilabel" in (
            capsys.readouterr().out
        )
        assert main(["info", str(tmp_path / "out")]) == 0
        assert "fields:  score: number float32; boxes: number int64 [4]; tags: multilabel float32 [3] (3 classes)" in (
            capsys.readouterr().out
        )
        with pytest.raises(SystemExit) as exited:
            main(["build-memmap", str(table_copy), "--column", "caption"])
        assert exited.value.code == 2 and "a column is given as NAME=ROLE" in capsys.readouterr().err


def edit_rows(rows: list[dict], case: str) -> tuple[list[dict], str]:
    """``rows`` with one bad input, and the message the build must give."""
    if case == "twice":
        rows[4]["file_name"] = rows[2]["file_name"]
        return rows, f"line 3 and line 5 both name {rows[2]['file_name']}; keep one of them"
    if case == "mixed":
        rows[6]["score"] = "high"
        return rows, "line 7: 'score' holds 'high' where the column holds numbers (a column of mixed types)"
    if case == "length":
        rows[5]["boxes"] = [1, 2, 3]
        return rows, "line 6: 'boxes' holds a list of 3 where the field holds a list of 4 numbers"
    if case == "empty_label":
        rows[1]["label"] = ""
        return rows, "line 2: the label is an empty label; give a class name or index"
    if case == "nan":
        rows[1]["score"] = float("nan")
        return rows, "line 2: 'score' is NaN; fill it, or leave the row out"
    if case == "mixed_labels":
        rows[3]["label"] = 2
        return rows, "line 4: the label 2 is a int where labels so far were strs (a column of mixed types)"
    if case == "outside":
        rows[0]["file_name"] = "../elsewhere.jpg"
        return rows, "line 1: 'file_name' is '../elsewhere.jpg', which lies outside the table's folder"
    raise AssertionError(case)


class TestBadInput:
    @pytest.mark.parametrize("case", ["twice", "mixed", "length", "empty_label", "nan", "mixed_labels", "outside"])
    def test_a_one_line_error_naming_the_row_and_nothing_written(self, table_copy, tmp_path, case):
        rows, message = edit_rows(photo_rows(table_copy), case)
        table = write_jsonl(table_copy / "metadata.jsonl", rows)
        before = snapshot(table_copy)
        with pytest.raises(SourceError) as raised:
            build_memmap(table_copy, tmp_path / "out", progress=False)
        assert str(raised.value).startswith(f"{table}: ") and message in str(raised.value)
        assert "\n" not in str(raised.value)
        assert [path.name for path in tmp_path.iterdir() if path.name != ".out.lock"] == ["photos"]  # no out, no .out-*
        # the scan's files closed by the failure, not left to the garbage collector (the error's frames hold them)
        assert [path for path in open_files() if path.startswith(f"{tmp_path}/.out.tmp-")] == []
        assert snapshot(table_copy) == before

    def test_an_unknown_class_name(self, table_copy, tmp_path):
        with pytest.raises(SourceError, match="line 1: unknown class name 'background'; the classes given are a, b"):
            build_memmap(table_copy, tmp_path / "out", classes=["a", "b"], progress=False)

    def test_a_missing_or_unreadable_file_is_skipped_and_listed(self, table_copy, tmp_path):
        rows = photo_rows(table_copy)
        (table_copy / rows[3]["file_name"]).unlink()
        (table_copy / rows[8]["file_name"]).write_bytes(b"not a photo")
        ds = MemmapImageDataset(build_memmap(table_copy, tmp_path / "out", progress=False))
        assert len(ds) == len(rows) - 2
        assert [entry["path"] for entry in ds.skipped] == sorted([rows[3]["file_name"], rows[8]["file_name"]])
        kept = [row for position, row in enumerate(rows) if position not in (3, 8)]
        assert [ds[position]["caption"] for position in range(len(ds))] == [row["caption"] for row in kept]
        assert verify_memmap(ds.path, progress=False) == []

    def test_two_tables_in_one_folder(self, table_copy, tmp_path):
        (table_copy / "metadata.csv").write_text("file_name\n")
        with pytest.raises(UsageError, match="holds metadata.csv and metadata.jsonl: one metadata table per folder"):
            build_memmap(table_copy, tmp_path / "out", progress=False)

    def test_a_table_without_its_image_column(self, table_copy, tmp_path):
        write_jsonl(table_copy / "metadata.jsonl", [{"path": row["file_name"]} for row in photo_rows(table_copy)])
        with pytest.raises(SourceError, match="has no 'file_name' column .*name the image column with --column"):
            build_memmap(table_copy, tmp_path / "out", progress=False)

    @pytest.mark.parametrize("role", ["mask", "text", "ignore"])
    def test_the_image_column_given_another_role_leaves_none(self, table_folder, tmp_path, role):
        """``--column file_name=mask`` (the README's ``--column seg=mask`` misread) left no image column: a
        StopIteration traceback."""
        with pytest.raises(SourceError, match=rf"no column holds the images: 'file_name' is given the role '{role}'"):
            build_memmap(table_folder, tmp_path / "out", columns={"file_name": role}, progress=False)
        assert not (tmp_path / "out").exists()

    def test_roles_are_checked(self, table_folder, tmp_path):
        with pytest.raises(UsageError, match="column 'tags' has role 'tag'; a role is one of image, label"):
            build_memmap(table_folder, tmp_path / "out", columns={"tags": "tag"}, progress=False)
