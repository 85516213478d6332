"""ConCuR ingestion: every source format, every reject reason, conservation, extra columns kept."""

import json

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dice_pipeline import concur
from dice_pipeline.concur import ConcurSource, SourceError, ingest
from dice_pipeline.schemas import CONCUR_PAIRS, CONCUR_REJECTS


@pytest.fixture
def rows(pair_factory):
    return [pair_factory(i, speedup=1.0 + i, stars=i) for i in range(3)]


def _table(rows):
    return pa.Table.from_pylist(rows)


def _check_accepted(accepted, rejects, rows_read, n):
    assert rows_read == n
    assert accepted.height == n and rejects.height == 0
    assert accepted.schema == CONCUR_PAIRS
    assert accepted["uuid"].to_list() == [f"pair-{i}" for i in range(n)]
    # Extra source columns survive in extra_json.
    assert [json.loads(e)["stars"] for e in accepted["extra_json"]] == list(range(n))


def test_reads_jsonl(tmp_path, rows):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    _check_accepted(*ingest(ConcurSource.parse(str(path))), n=3)


def test_reads_parquet(tmp_path, rows):
    path = tmp_path / "pairs.parquet"
    pq.write_table(_table(rows), path)
    _check_accepted(*ingest(ConcurSource.parse(str(path))), n=3)


@pytest.mark.parametrize("writer", [pa.ipc.new_stream, pa.ipc.new_file], ids=["stream", "file"])
def test_reads_arrow_stream_and_file_formats(tmp_path, rows, writer):
    table = _table(rows)
    path = tmp_path / "data-00000-of-00001.arrow"
    with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as out:
        out.write_table(table)
    _check_accepted(*ingest(ConcurSource.parse(str(path))), n=3)


def test_reads_save_to_disk_directory(tmp_path, rows):
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    _check_accepted(*ingest(ConcurSource.parse(str(tmp_path / "ds"))), n=3)


def test_reads_dataset_dict_split(tmp_path, rows):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    _check_accepted(*ingest(ConcurSource("disk", str(tmp_path / "dd"), split="train")), n=3)
    with pytest.raises(SourceError, match="splits"):
        ingest(ConcurSource("disk", str(tmp_path / "dd"), split="test"))


def test_hub_source_goes_through_load_dataset(tmp_path, rows):
    # No hub access here: load_dataset on a local data directory exercises the same code path as a hub id.
    (tmp_path / "hub").mkdir()
    pq.write_table(_table(rows), tmp_path / "hub" / "train.parquet")
    _check_accepted(*ingest(ConcurSource("hf", str(tmp_path / "hub"))), n=3)


def test_source_spec_parsing(tmp_path, monkeypatch):
    assert ConcurSource.parse("hf:lkongam/ConCuR") == ConcurSource("hf", "lkongam/ConCuR")
    assert ConcurSource.parse("lkongam/ConCuR").kind == "hf"
    assert ConcurSource.parse("x.parquet").kind == "parquet"
    assert ConcurSource.parse("").kind == "embedded"
    monkeypatch.setenv(concur.SOURCE_ENV_VAR, "jsonl:/data/pairs.jsonl")
    assert ConcurSource.resolve("") == ConcurSource("jsonl", "/data/pairs.jsonl")
    assert ConcurSource.resolve("embedded").kind == "embedded"
    with pytest.raises(SourceError):
        ConcurSource.parse("weird.xlsx")
    with pytest.raises(SourceError, match="does not exist"):
        ingest(ConcurSource("parquet", str(tmp_path / "missing.parquet")))


def _bad_rows(pair_factory):
    """(reason_code, row) for every way a row can be rejected."""
    good = pair_factory(0)
    no_model = pair_factory(10)
    no_model["pytorch_code"] = no_model["pytorch_code"].replace("class Model(", "class Net(")
    no_inputs = pair_factory(11)
    no_inputs["pytorch_code"] = no_inputs["pytorch_code"].replace("def get_inputs", "def make_inputs")
    no_init = pair_factory(12)
    no_init["pytorch_code"] = no_init["pytorch_code"].replace("def get_init_inputs", "def init_args")
    no_new = pair_factory(13)
    no_new["generated_code"] = no_new["generated_code"].replace("class ModelNew", "class FastModel")
    missing = pair_factory(14)
    del missing["generated_code"]
    null_uuid = pair_factory(15, uuid=None)
    return [
        ("kept", good),
        ("missing_required_column", missing),
        ("missing_required_column", null_uuid),
        ("empty_code", pair_factory(16, pytorch_code="   \n")),
        ("empty_code", pair_factory(17, generated_code=42)),
        ("unparseable_reference", pair_factory(18, pytorch_code="class Model(:\n")),
        ("no_model_class", no_model),
        ("no_get_inputs", no_inputs),
        ("no_get_init_inputs", no_init),
        ("unparseable_candidate", pair_factory(19, generated_code="def broken(:")),
        ("no_model_new", no_new),
        ("invalid_speedup", pair_factory(20, speedup="fast")),
        ("invalid_speedup", pair_factory(21, speedup=float("nan"))),
        ("invalid_speedup", pair_factory(22, speedup=-1.0)),
        ("duplicate_content", {**good, "uuid": "another-uuid"}),
        ("duplicate_uuid", pair_factory(23, uuid=good["uuid"])),
    ]


def test_every_reject_reason_and_conservation(tmp_path, pair_factory):
    cases = _bad_rows(pair_factory)
    path = tmp_path / "pairs.jsonl"
    lines = [json.dumps(row) for _, row in cases] + ["{not json", "[1, 2]"]
    path.write_text("\n".join(lines))
    accepted, rejects, rows_read = ingest(ConcurSource.parse(str(path)))

    assert rows_read == len(cases) + 2
    assert accepted.height + rejects.height == rows_read
    assert rejects.schema == CONCUR_REJECTS
    assert accepted["uuid"].to_list() == ["pair-0"]
    expected = [code for code, _ in cases if code != "kept"] + ["unparseable_row", "unparseable_row"]
    assert rejects.sort("source_row")["reason_code"].to_list() == expected
    # The rejected row is kept as read, so nothing is lost silently.
    first = rejects.filter(pl.col("reason_code") == "invalid_speedup").row(0, named=True)
    assert json.loads(first["row_json"])["speedup_over_eager"] == "fast"


def test_missing_optional_columns_become_null(tmp_path, pair_factory):
    row = pair_factory(0)
    del row["problem_name"], row["generated_think"], row["speedup_over_eager"]
    path = tmp_path / "pairs.parquet"
    pq.write_table(_table([row]), path)
    accepted, rejects, _ = ingest(ConcurSource.parse(str(path)))
    assert rejects.height == 0
    assert accepted.row(0, named=True)["speedup_over_eager"] is None
    assert accepted.row(0, named=True)["problem_name"] is None


def test_code_saved_as_a_markdown_answer_is_unwrapped_and_the_row_says_so(tmp_path, pair_factory):
    plain = pair_factory(0)
    fenced = pair_factory(1)
    code = fenced["generated_code"]
    fenced["generated_code"] = ("<think>first a draft</think>\nHere is the optimized model:\n\n```python\n" + code
                                + "\n```\n\nIt fuses the two ops.")
    broken = pair_factory(2)
    broken["generated_code"] = "Here it is:\n```python\nclass ModelNew(:\n```"
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in (plain, fenced, broken)))
    accepted, rejects, _ = ingest(ConcurSource.parse(str(path)))

    by_uuid = {row["uuid"]: row for row in accepted.iter_rows(named=True)}
    assert by_uuid["pair-0"]["normalisations"] is None
    assert by_uuid["pair-0"]["generated_code"] == plain["generated_code"]
    unwrapped = by_uuid["pair-1"]
    assert unwrapped["generated_code"].strip() == code.strip()
    assert unwrapped["normalisations"].startswith("generated_code: code taken from a fenced markdown block")
    # The hash is of the code that will be judged, so the same pair fenced and plain is one pair.
    assert unwrapped["content_sha256"] == concur.content_sha256(fenced["pytorch_code"], code)
    # A fence around code that still does not parse is rejected, and the snapshot is the row as read.
    (reject,) = rejects.iter_rows(named=True)
    assert reject["reason_code"] == "unparseable_candidate" and reject["uuid"] == "pair-2"
    assert json.loads(reject["row_json"])["generated_code"] == broken["generated_code"]


def test_missing_or_misshapen_paths_are_named_before_reading(tmp_path):
    with pytest.raises(SourceError, match=f"parquet source {tmp_path / 'missing.parquet'} does not exist"):
        ConcurSource("parquet", str(tmp_path / "missing.parquet")).check_exists()
    with pytest.raises(SourceError, match="is a directory"):
        ConcurSource("jsonl", str(tmp_path)).check_exists()
    ConcurSource("embedded").check_exists()


def test_content_hash_follows_the_rows_not_the_file_format(tmp_path, rows):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(_table(rows), tmp_path / "p.parquet")
    as_jsonl = concur.ingest_source(ConcurSource.parse(str(jsonl)))
    as_parquet = concur.ingest_source(ConcurSource.parse(str(tmp_path / "p.parquet")))
    assert as_jsonl.source_sha256 == as_parquet.source_sha256
    jsonl.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    assert concur.ingest_source(ConcurSource.parse(str(jsonl))).source_sha256 != as_jsonl.source_sha256


def test_overwrite_refusal_needs_the_users_say_so():
    refuse = concur.overwrite_refusal
    assert refuse(None, "jsonl:a", accepted=3, rows_read=3) is None  # first ingestion
    assert refuse("jsonl:a", "jsonl:a", accepted=3, rows_read=4) is None  # new content, same source
    assert "no accepted rows (2 rows read" in refuse(None, "jsonl:a", accepted=0, rows_read=2)
    assert refuse(None, "jsonl:a", accepted=0, rows_read=2, allow_empty=True) is None
    switched = refuse("embedded", "jsonl:a", accepted=3, rows_read=3)
    assert "from embedded, not jsonl:a" in switched and "--allow-source-change" in switched
    assert refuse("embedded", "jsonl:a", accepted=3, rows_read=3, allow_source_change=True) is None


def test_a_file_of_the_wrong_format_is_a_source_error_naming_it(tmp_path):
    (tmp_path / "pairs.parquet").write_text("not parquet\n")
    with pytest.raises(SourceError, match=f"parquet source {tmp_path / 'pairs.parquet'} is not a readable Parquet"):
        ingest(ConcurSource.parse(str(tmp_path / "pairs.parquet")))
    (tmp_path / "folder").mkdir()
    with pytest.raises(SourceError, match="is not a save_to_disk folder"):
        ingest(ConcurSource("disk", str(tmp_path / "folder")))


def test_bytes_that_are_not_utf8_are_replaced_and_the_row_says_so(tmp_path, pair_factory):
    in_comment, in_code, clean = pair_factory(0), pair_factory(1), pair_factory(2)
    in_comment["generated_code"] = "# caf\udce9 au lait\n" + in_comment["generated_code"]  # becomes the byte 0xE9
    in_code["generated_code"] = in_code["generated_code"].replace("class ModelNew", "class Model\udcffNew")
    lines = [json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogateescape") for row in (in_comment, in_code)]
    surrogate = json.dumps(pair_factory(3, problem_name="x\ud800y"))  # the JSON escape of half a UTF-16 pair
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\n".join([*lines, json.dumps(clean).encode(), surrogate.encode()]) + b"\n")
    accepted, rejects, rows_read = ingest(ConcurSource.parse(str(path)))

    assert rows_read == 4 and accepted.height + rejects.height == 4
    by_uuid = {row["uuid"]: row for row in accepted.iter_rows(named=True)}
    replaced = by_uuid["pair-0"]
    assert replaced["generated_code"].startswith("# caf\ufffd au lait\n")  # replaced, never silently
    offset = lines[0].index(bytes([0xE9]))
    assert replaced["normalisations"] == ("line 1: 1 byte sequence(s) not valid UTF-8 replaced by U+FFFD (at byte "
                                          f"{offset} of the line)")
    assert by_uuid["pair-2"]["normalisations"] is None
    assert by_uuid["pair-3"]["problem_name"] == "x\ufffdy"
    assert by_uuid["pair-3"]["normalisations"] == "problem_name: 1 lone UTF-16 surrogate(s) (not valid Unicode text) " \
                                                  "replaced by U+FFFD"
    # Where the replacement breaks the code, the row is rejected as any such row, and its message says what was read.
    (reject,) = rejects.iter_rows(named=True)
    assert reject["uuid"] == "pair-1" and reject["reason_code"] == "unparseable_candidate"
    assert "[as read: line 2: 1 byte sequence(s) not valid UTF-8 replaced by U+FFFD" in reject["message"]
