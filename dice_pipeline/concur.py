"""ConCuR ingestion: read PyTorch->CUDA pairs from any supported source and validate every row.

Sources: the Hugging Face hub id (`datasets.load_dataset`), a `save_to_disk` directory, one `.arrow` file (stream or
file format), Parquet, JSONL, or the seed corpus shipped with the project. Every row read ends up either accepted or
in the rejects frame with a reason code: rows in == accepted + rejected. Nothing in a row is changed without a
record: code saved as a model's markdown answer is taken out of its fence when only the fenced block parses, and
bytes that are not UTF-8 (or JSON escapes of half a UTF-16 pair) are replaced by U+FFFD; an accepted row records
each in `normalisations`, a rejected one in its message.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from dice_pipeline import settings
from dice_pipeline.prompts import unwrap_code_answer
from dice_pipeline.schemas import (
    CONCUR_KNOWN_COLUMNS,
    CONCUR_PAIRS,
    CONCUR_REJECTS,
    CONCUR_REQUIRED_COLUMNS,
)

SOURCE_ENV_VAR = settings.CONCUR_SOURCE.name
DEFAULT_HF_ID = "lkongam/ConCuR"
SOURCE_KINDS = ("embedded", "hf", "disk", "arrow", "parquet", "jsonl")
_MAX_REJECT_FIELD_CHARS = 4000


class SourceError(ValueError):
    """The source as a whole cannot be read (missing file, unknown format): nothing to ingest."""


@dataclass(frozen=True)
class ConcurSource:
    kind: str
    location: str = ""
    split: str = "train"

    def __post_init__(self):
        if self.kind not in SOURCE_KINDS:
            raise SourceError(f"unknown source kind {self.kind!r}; expected one of {', '.join(SOURCE_KINDS)}")
        if self.kind != "embedded" and not self.location:
            raise SourceError(f"source kind {self.kind!r} needs a location (hub id or path)")

    @property
    def name(self) -> str:
        return "embedded" if self.kind == "embedded" else f"{self.kind}:{self.location}"

    @classmethod
    def parse(cls, spec: str | None, split: str = "train") -> ConcurSource:
        """Parse a source spec: `embedded`, `hf:<id>`, `<kind>:<path>`, or a bare path (kind from its shape)."""
        spec = (spec or "").strip() or "embedded"
        if spec == "embedded":
            return cls("embedded", split=split)
        kind, sep, rest = spec.partition(":")
        if sep and kind in SOURCE_KINDS:
            return cls(kind, rest, split)
        path = Path(spec)
        if path.is_dir():
            return cls("disk", spec, split)
        suffix = path.suffix.lower()
        by_suffix = {".arrow": "arrow", ".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
        if suffix in by_suffix:
            return cls(by_suffix[suffix], spec, split)
        if not path.exists() and spec.count("/") == 1:
            return cls("hf", spec, split)  # looks like a hub id, e.g. lkongam/ConCuR
        raise SourceError(f"cannot tell what kind of source {spec!r} is; prefix it with one of {SOURCE_KINDS}")

    def check_exists(self) -> None:
        """Raise SourceError if a local source's path is missing or of the wrong kind (before any work starts)."""
        if self.kind in ("embedded", "hf"):
            return
        path = Path(self.location)
        if not path.exists():
            raise SourceError(f"{self.kind} source {path} does not exist")
        if self.kind == "disk" and not path.is_dir():
            raise SourceError(f"disk source {path} is not a directory (a save_to_disk folder is expected)")
        if self.kind != "disk" and path.is_dir():
            raise SourceError(f"{self.kind} source {path} is a directory, not a {self.kind} file")

    def check_readable(self) -> None:
        """`check_exists`, then open a local source the way ingestion will and read its schema, not its rows: a
        file that exists but is not what its kind says (a truncated or mislabelled Parquet file, an unreadable
        one) is a SourceError here, before any run starts. A hub source is checked by loading it."""
        self.check_exists()
        path = Path(self.location)
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            with _unreadable_as_source_error(f"parquet source {path} is not a readable Parquet file"):
                metadata = pq.ParquetFile(path).metadata
                for index in range(metadata.num_row_groups):  # each row group's footer entry, not its data
                    metadata.row_group(index)
        elif self.kind == "arrow":
            _read_arrow_file(path, schema_only=True)
        elif self.kind == "disk":
            markers = ("state.json", "dataset_info.json", "dataset_dict.json")
            if not any((path / marker).is_file() for marker in markers):
                raise SourceError(f"disk source {path} is not a save_to_disk folder (it has none of "
                                  f"{', '.join(markers)})")
        elif self.kind == "jsonl":
            with _unreadable_as_source_error(f"jsonl source {path} cannot be read"), open(path, "rb") as handle:
                handle.read(1)

    @classmethod
    def resolve(cls, spec: str | None = None, split: str = "train") -> ConcurSource:
        """`spec` if given, else the DICE_CONCUR_SOURCE environment variable, else the embedded seed corpus."""
        return cls.parse(spec or settings.CONCUR_SOURCE.get(), split=split)


@dataclass
class SourceRow:
    """One row as read: its index in the source and either its fields or why it could not be read."""

    index: int
    fields: dict[str, Any] | None
    read_error: tuple[str, str] | None = None  # (reason_code, message)
    # What reading changed in the row (bytes that are not UTF-8, replaced): recorded with it, never silent.
    notes: tuple[str, ...] = ()


def _table_rows(table) -> Iterator[SourceRow]:
    for index, fields in enumerate(table.to_pylist()):
        yield SourceRow(index, fields)


def read_source(source: ConcurSource) -> Iterator[SourceRow]:
    """Yield every row of the source. Raises SourceError when the source itself cannot be opened."""
    if source.kind == "embedded":
        from dice_pipeline.seed_corpus import load_seed_pairs

        for index, fields in enumerate(load_seed_pairs()):
            yield SourceRow(index, fields)
        return
    if source.kind == "hf":
        import datasets

        with _unreadable_as_source_error(f"hf source {source.location} cannot be loaded"):
            dataset = datasets.load_dataset(source.location, split=source.split)
        yield from _table_rows(dataset.data.table)
        return
    source.check_exists()
    path = Path(source.location)
    if source.kind == "disk":
        import datasets

        with _unreadable_as_source_error(f"disk source {path} is not a save_to_disk folder"):
            loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if source.split not in loaded:
                raise SourceError(f"{path} has splits {list(loaded)}, not {source.split!r}")
            loaded = loaded[source.split]
        yield from _table_rows(loaded.data.table)
    elif source.kind == "arrow":
        yield from _table_rows(_read_arrow_file(path))
    elif source.kind == "parquet":
        import pyarrow.parquet as pq

        with _unreadable_as_source_error(f"parquet source {path} is not a readable Parquet file"):
            table = pq.read_table(path)
        yield from _table_rows(table)
    elif source.kind == "jsonl":
        yield from _read_jsonl(path)


@contextmanager
def _unreadable_as_source_error(what: str):
    """A source that exists but cannot be opened is a SourceError naming it, with the reader's first line of why."""
    try:
        yield
    except SourceError:
        raise
    except Exception as exc:  # readers raise many types (ArrowInvalid, FileNotFoundError, hub errors)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SourceError(f"{what} ({type(exc).__name__}: {reason})") from exc


def _read_arrow_file(path: Path, schema_only: bool = False):
    """Hugging Face writes Arrow in the streaming format; plain Arrow IPC files use the file format: try both.
    `schema_only`: open it and read its schema (a check that it is Arrow at all)."""
    import pyarrow as pa

    errors = []
    for opener in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with pa.memory_map(str(path)) as source:
                reader = opener(source)
                return reader.schema if schema_only else reader.read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            errors.append(f"{opener.__name__}: {exc}")
    raise SourceError(f"{path} is not an Arrow IPC stream or file ({'; '.join(errors)})")


def _read_jsonl(path: Path) -> Iterator[SourceRow]:
    """One row per non-empty line. Bytes that are not UTF-8 are replaced by U+FFFD, and the row says where."""
    with open(path, "rb") as handle:
        index = 0
        for line_number, raw in _numbered_lines(handle):
            line, invalid = decode_utf8(raw)
            if not line.strip():
                continue
            notes = ()
            if invalid:
                offsets = ", ".join(str(offset) for offset in invalid[:5]) + (", ..." if len(invalid) > 5 else "")
                notes = (f"line {line_number}: {len(invalid)} byte sequence(s) not valid UTF-8 replaced by U+FFFD "
                         f"(at byte {offsets} of the line)",)
            try:
                fields = json.loads(line)
            except json.JSONDecodeError as exc:
                yield SourceRow(index, None, ("unparseable_row", f"line {line_number}: invalid JSON ({exc.msg})"),
                                notes)
            else:
                if isinstance(fields, dict):
                    yield SourceRow(index, fields, notes=notes)
                else:
                    yield SourceRow(index, None, ("unparseable_row", f"line {line_number}: not a JSON object"), notes)
            index += 1


def _numbered_lines(handle) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a binary file, lines ended by \\n, \\r\\n or \\r as text mode would split them."""
    number = 0
    for chunk in handle:
        for raw in re.split(rb"\r(?!\n)", chunk) if b"\r" in chunk else (chunk,):
            number += 1
            yield number, raw


def decode_utf8(raw: bytes) -> tuple[str, list[int]]:
    """`raw` as UTF-8 text, each invalid byte sequence replaced by U+FFFD; and the byte offset of each."""
    parts, invalid, position = [], [], 0
    while True:
        try:
            parts.append(raw[position:].decode("utf-8"))
            return "".join(parts), invalid
        except UnicodeDecodeError as exc:
            parts.append(raw[position:position + exc.start].decode("utf-8"))
            parts.append("\ufffd")
            invalid.append(position + exc.start)
            position += exc.end


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(fields: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A JSON escape such as "\\ud800" decodes to half a UTF-16 pair, which no UTF-8 text (the hash, the warehouse)
    can hold: each is replaced by U+FFFD, column by column, and recorded."""
    notes, cleaned = [], fields
    for column, value in fields.items():
        if isinstance(value, str) and _LONE_SURROGATE.search(value):
            replaced, count = _LONE_SURROGATE.subn("\ufffd", value)
            cleaned = {**cleaned, column: replaced}
            notes.append(f"{column}: {count} lone UTF-16 surrogate(s) (not valid Unicode text) replaced by U+FFFD")
    return cleaned, notes


# --- validation ---------------------------------------------------------------------------------------------


def _normalise_code(code: str) -> str:
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip()


def content_sha256(pytorch_code: str, generated_code: str) -> str:
    payload = _normalise_code(pytorch_code) + "\0" + _normalise_code(generated_code)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _top_level_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names of top-level classes and functions (assignments count too: `ModelNew = SomeClass`)."""
    classes, functions = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    classes.add(target.id)
                    functions.add(target.id)
    return classes, functions


def _parse(code: str) -> ast.Module | str:
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # e.g. source with NUL bytes
        return str(exc)


def check_pair(fields: dict[str, Any]) -> tuple[str, str] | None:
    """Return (reason_code, message) for the first problem with one row, or None if the row is usable.

    Duplicates are decided across rows, by `validate_concur_rows`.
    """
    for column in CONCUR_REQUIRED_COLUMNS:
        if fields.get(column) is None:
            return "missing_required_column", f"required column {column!r} is missing or null"
    for column in ("pytorch_code", "generated_code"):
        value = fields[column]
        if not isinstance(value, str):
            return "empty_code", f"{column} is a {type(value).__name__}, not text"
        if not value.strip():
            return "empty_code", f"{column} is empty"
    reference = _parse(fields["pytorch_code"])
    if isinstance(reference, str):
        return "unparseable_reference", f"pytorch_code does not parse: {reference}"
    classes, functions = _top_level_names(reference)
    if "Model" not in classes:
        return "no_model_class", "pytorch_code defines no top-level class Model"
    if "get_inputs" not in functions:
        return "no_get_inputs", "pytorch_code defines no top-level get_inputs()"
    if "get_init_inputs" not in functions:
        return "no_get_init_inputs", "pytorch_code defines no top-level get_init_inputs()"
    candidate = _parse(fields["generated_code"])
    if isinstance(candidate, str):
        return "unparseable_candidate", f"generated_code does not parse: {candidate}"
    if "ModelNew" not in _top_level_names(candidate)[0]:
        return "no_model_new", "generated_code defines no top-level class ModelNew"
    speedup = fields.get("speedup_over_eager")
    if speedup is not None:
        try:
            value = float(speedup)
        except (TypeError, ValueError):
            return "invalid_speedup", f"speedup_over_eager {speedup!r} is not a number"
        if not math.isfinite(value) or value <= 0:
            return "invalid_speedup", f"speedup_over_eager {speedup!r} is not a positive finite number"
    return None


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _reject_snapshot(fields: dict[str, Any] | None) -> str:
    if fields is None:
        return "null"
    clipped = {}
    for key, value in fields.items():
        if isinstance(value, str) and len(value) > _MAX_REJECT_FIELD_CHARS:
            value = value[:_MAX_REJECT_FIELD_CHARS] + f"... [{len(value) - _MAX_REJECT_FIELD_CHARS} more chars]"
        clipped[str(key)] = _json_safe(value)
    return json.dumps(clipped, sort_keys=True)


def validate_concur_rows(rows: Iterable[SourceRow], source_name: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split rows into accepted pairs and rejects (with reason codes). Keeps the first of duplicate rows."""
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    seen_content: dict[str, str] = {}
    seen_uuid: dict[str, int] = {}

    def reject(row: SourceRow, code: str, message: str, read_notes: Iterable[str] = ()) -> None:
        uuid = row.fields.get("uuid") if row.fields else None
        rejected.append(
            {
                "source_name": source_name,
                "source_row": row.index,
                "uuid": None if uuid is None else str(uuid),
                "reason_code": code,
                # what reading changed in the row is said here too: a reject is a record of the row as read
                "message": message + "".join(f" [as read: {note}]" for note in read_notes),
                "row_json": _reject_snapshot(row.fields),
            }
        )

    for row in rows:
        if row.read_error is not None:
            reject(row, *row.read_error, read_notes=row.notes)
            continue
        fields, surrogates = _without_lone_surrogates(row.fields)
        read_notes = [*row.notes, *surrogates]  # what reading changed: kept with the row whatever becomes of it
        unwrapped = []
        problem = check_pair(fields)
        if problem is not None and problem[0] in ("unparseable_reference", "unparseable_candidate"):
            # Only code that does not parse is looked at again, as a markdown answer (parsing is the row's main cost).
            fields = dict(fields)
            for column in ("pytorch_code", "generated_code"):
                fields[column], dropped = unwrap_code_answer(fields[column])
                if dropped is not None:
                    unwrapped.append(f"{column}: code taken from a fenced markdown block ({dropped} characters around "
                                     f"it dropped)")
            problem = check_pair(fields) if unwrapped else problem
        if problem is not None:
            reject(row, *problem, read_notes=read_notes)  # the snapshot is the row as read, before any unwrapping
            continue
        notes = read_notes + unwrapped
        uuid = str(fields["uuid"])
        digest = content_sha256(fields["pytorch_code"], fields["generated_code"])
        if digest in seen_content:
            reject(row, "duplicate_content", f"same reference and candidate as uuid {seen_content[digest]}", read_notes)
            continue
        if uuid in seen_uuid:
            reject(row, "duplicate_uuid", f"uuid already used by source row {seen_uuid[uuid]} with other content",
                   read_notes)
            continue
        seen_content[digest] = uuid
        seen_uuid[uuid] = row.index
        speedup = fields.get("speedup_over_eager")
        extra = {str(k): _json_safe(v) for k, v in fields.items() if k not in CONCUR_KNOWN_COLUMNS}
        accepted.append(
            {
                "uuid": uuid,
                "problem_name": None if fields.get("problem_name") is None else str(fields["problem_name"]),
                "pytorch_code": fields["pytorch_code"],
                "generated_code": fields["generated_code"],
                "generated_think": None if fields.get("generated_think") is None else str(fields["generated_think"]),
                "speedup_over_eager": None if speedup is None else float(speedup),
                "source_name": source_name,
                "source_row": row.index,
                "content_sha256": digest,
                "extra_json": json.dumps(extra, sort_keys=True),
                "normalisations": "; ".join(notes) or None,
            }
        )
    return (
        pl.DataFrame(accepted, schema=CONCUR_PAIRS),
        pl.DataFrame(rejected, schema=CONCUR_REJECTS),
    )


def rows_sha256(rows: Iterable[SourceRow]) -> str:
    """The hash of a source's content as read: every row in order (its fields, or why it could not be read).
    Two reads of the same content give the same hash, whatever the file format it was stored in."""
    digest = hashlib.sha256()
    for row in rows:
        if row.read_error is not None:
            payload = json.dumps(row.read_error)
        else:
            payload = json.dumps({str(k): _json_safe(v) for k, v in (row.fields or {}).items()}, sort_keys=True)
        digest.update(payload.encode("utf-8", errors="replace") + b"\n")
    return digest.hexdigest()


@dataclass
class Ingested:
    accepted: pl.DataFrame
    rejects: pl.DataFrame
    rows_read: int
    source_sha256: str


def ingest_source(source: ConcurSource) -> Ingested:
    """Read, hash and validate a source."""
    rows = list(read_source(source))
    accepted, rejects = validate_concur_rows(rows, source.name)
    return Ingested(accepted, rejects, len(rows), rows_sha256(rows))


def ingest(source: ConcurSource) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Read and validate a source. Returns (accepted, rejects, rows_read)."""
    result = ingest_source(source)
    return result.accepted, result.rejects, result.rows_read


def overwrite_refusal(
    previous_source: str | None,
    new_source: str,
    accepted: int,
    rows_read: int,
    allow_empty: bool = False,
    allow_source_change: bool = False,
) -> str | None:
    """Why an ingestion must not replace the tables already there, or None if it may.

    A source with no accepted row would replace a dataset by nothing; a different source would leave results of two
    sources side by side downstream. Either needs the user's say-so. A first ingestion (nothing there) is always fine,
    and so is new content from the same source.
    """
    if accepted == 0 and not allow_empty:
        return (f"source {new_source} has no accepted rows ({rows_read} rows read, none accepted): refusing to "
                f"replace the ingested pairs with nothing (allow_empty / --allow-empty to write it anyway)")
    if previous_source is not None and previous_source != new_source and not allow_source_change:
        return (f"the warehouse holds pairs ingested from {previous_source}, not {new_source}: refusing to mix "
                f"sources (allow_source_change / --allow-source-change to replace them)")
    return None
