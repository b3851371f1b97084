import json

import pytest

from smoothcert import SmoothcertError
from smoothcert.runs.records import (
    global_indices,
    manifest_path,
    merge_records,
    open_records,
    read_records,
    shard_indices,
    shard_path,
)

COLUMNS = ("idx", "label", "predict", "radius", "correct", "time")


def manifest(shard=(0, 1), **identity):
    return {"identity": {"sigma": 0.25, **identity},
            "shard": {"index": shard[0], "count": shard[1]},
            "indices": {"dataset_size": 10, "skip": 2, "max_count": None}}


def row(i):
    return {"idx": i, "label": i % 3, "predict": i % 3, "radius": 0.1 * i + 1e-17 * i,
            "correct": 1, "time": 0.5}


def write(path, indices, m):
    writer, done = open_records(path, COLUMNS, m)
    with writer:
        for i in indices:
            if i not in done:
                writer.write(row(i))
    return done


def test_floats_round_trip_at_full_precision(tmp_path):
    path = tmp_path / "r.tsv"
    write(path, [0, 2, 4], manifest())
    rec = read_records(path)
    assert list(rec["idx"]) == [0, 2, 4]
    assert [float(r) for r in rec["radius"]] == [row(i)["radius"] for i in (0, 2, 4)]
    assert json.loads(manifest_path(path).read_text())["columns"] == list(COLUMNS)


def test_resume_skips_done_rows_and_redoes_a_torn_line(tmp_path):
    path = tmp_path / "r.tsv"
    write(path, [0, 2], manifest())
    with open(path, "a") as f:
        f.write("4\t1\t1\t0.3")  # killed mid-write: no newline
    assert set(read_records(path)["idx"]) == {0, 2}  # a torn line is never read
    done = write(path, [0, 2, 4, 6], manifest())
    assert done == {0, 2}
    reference = tmp_path / "ref.tsv"
    write(reference, [0, 2, 4, 6], manifest())
    assert path.read_text() == reference.read_text()


def test_resume_with_another_configuration_is_refused(tmp_path):
    path = tmp_path / "r.tsv"
    write(path, [0], manifest())
    with pytest.raises(SmoothcertError, match="differs in: sigma"):
        open_records(path, COLUMNS, manifest(sigma=0.5))
    before = path.read_text()
    with pytest.raises(SmoothcertError, match="columns"):
        open_records(path, COLUMNS[:-1], manifest())
    assert path.read_text() == before


def test_existing_file_without_manifest_and_unwritable_outputs(tmp_path):
    (tmp_path / "foreign.tsv").write_text("idx\tlabel\n")
    with pytest.raises(SmoothcertError, match="no manifest"):
        open_records(tmp_path / "foreign.tsv", COLUMNS, manifest())
    writer, done = open_records(tmp_path / "new" / "r.tsv", COLUMNS, manifest())
    writer.close()  # a missing folder is created, as train creates its run folder
    assert done == set() and (tmp_path / "new" / "r.tsv").is_file()
    with pytest.raises(SmoothcertError, match="a file is in the way"):
        open_records(tmp_path / "foreign.tsv" / "r.tsv", COLUMNS, manifest())
    with pytest.raises(SmoothcertError, match="directory"):
        open_records(tmp_path, COLUMNS, manifest())


def test_index_contract():
    assert global_indices(10, 3) == [0, 3, 6, 9]
    assert global_indices(10, 3, 2) == [0, 3]
    everything = global_indices(100, 7)
    shards = [shard_indices(everything, k, 3) for k in range(3)]
    assert sorted(sum(shards, [])) == everything
    assert shard_path("a/out.tsv", 3, 16).name == "out.shard03-of-16.tsv"
    assert shard_path("out.tsv", 0, 1).name == "out.tsv"


def make_shards(tmp_path, k_total=2, identity=None):
    paths = []
    for k in range(k_total):
        path = shard_path(tmp_path / "s.tsv", k, k_total)
        write(path, shard_indices(global_indices(10, 2), k, k_total),
              manifest((k, k_total), **(identity or {})))
        paths.append(path)
    return paths


def test_merge_equals_one_run(tmp_path):
    merged = merge_records(make_shards(tmp_path), tmp_path / "merged.tsv")
    single = tmp_path / "single.tsv"
    write(single, global_indices(10, 2), manifest())
    assert merged.read_text() == single.read_text()


def test_merge_refuses_gaps_duplicates_and_mixed_configs(tmp_path):
    a, b = make_shards(tmp_path)
    with pytest.raises(SmoothcertError, match="shards"):
        merge_records([a], tmp_path / "m.tsv")  # shard 1 of 2 missing
    with pytest.raises(SmoothcertError, match="expected each"):
        merge_records([a, a, b], tmp_path / "m.tsv")
    lines = b.read_text().splitlines(keepends=True)
    b.write_text("".join(lines[:-1]))  # an unfinished shard
    with pytest.raises(SmoothcertError, match="incomplete"):
        merge_records([a, b], tmp_path / "m.tsv")
    (tmp_path / "x").mkdir()
    other = make_shards(tmp_path / "x", 2, {"sigma": 1.0})
    with pytest.raises(SmoothcertError, match="different configuration"):
        merge_records([a, other[1]], tmp_path / "m.tsv")
    assert not (tmp_path / "m.tsv").exists()


def test_reads_cohen_files_with_timedelta_times(tmp_path):
    path = tmp_path / "cohen.tsv"
    path.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
                    "0\t3\t3\t0.51\t1\t0:00:01.500000\n20\t8\t-1\t0.0\t0\t1:02:03.25\n"
                    "40\t1\t1\t0.2\t1\t2 days, 0:00:01\n")
    rec = read_records(path)
    assert list(rec["time"]) == [1.5, 3723.25, 2 * 86400 + 1]
    assert list(rec["predict"]) == [3, -1, 1] and rec.manifest is None


def test_malformed_record_files(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\nworld\n")
    with pytest.raises(SmoothcertError, match="not a record file"):
        read_records(bad)
    bad.write_text("idx\tlabel\n1\t2\t3\n")
    with pytest.raises(SmoothcertError, match="fields"):
        read_records(bad)
    with pytest.raises(SmoothcertError, match="cannot read"):
        read_records(tmp_path / "missing.tsv")


def test_distinct_labels():
    from smoothcert.runs.records import distinct_labels

    assert distinct_labels(["runs/a/certify.tsv", "runs/b/certify.tsv"]) == ["a/certify",
                                                                             "b/certify"]
    assert distinct_labels(["x.tsv", "y.tsv"]) == ["x", "y"]
    assert distinct_labels(["d/x.tsv", "d/x.tsv"]) == ["x", "x"]  # one file given twice


def test_a_second_writer_on_the_same_file_is_refused_until_the_first_closes(tmp_path):
    # flock conflicts between two open file descriptions, even within one process.
    from smoothcert.runs.records import open_records

    out = tmp_path / "r.tsv"
    manifest = {"identity": {"a": 1}}
    writer, _ = open_records(out, ("idx", "x"), manifest)
    with pytest.raises(SmoothcertError, match="another process"):
        open_records(out, ("idx", "x"), manifest)
    writer.write({"idx": 0, "x": 1.0})
    writer.close()
    assert not (tmp_path / "r.tsv.lock").exists()
    again, done = open_records(out, ("idx", "x"), manifest)  # resumes once the first is closed
    again.close()
    assert done == {0}
