"""The stages' input files: rows of JSONL, JSON or Parquet (what `dice export-training-data` and the Dagster assets
write), and the chat messages of a CuKe row. Standard library only (pyarrow for Parquet, present on the GPU image).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL, JSON (a list of objects) or Parquet file."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: expected .jsonl, .json or .parquet")


def write_jsonl(rows: Sequence[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def as_messages(prompt) -> list[dict]:
    """A prompt as chat messages: a string is one user turn."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def chat_prompt(row: dict):
    """The chat messages of a CuKe row: `prompt_messages` (a JSON list) when present, else `prompt` as one user
    turn (the rendered `prompt` column must not be rendered a second time)."""
    messages = row.get("prompt_messages")
    if isinstance(messages, str) and messages.strip():
        return json.loads(messages)
    if isinstance(messages, list) and messages:
        return messages
    return row["prompt"]


def training_texts(rows: Sequence[dict]) -> list[str]:
    """What a preset base's tokenizer is trained on: every chat turn and response of the SFT rows."""
    return [m["content"] for r in rows for m in as_messages(chat_prompt(r))] + [r["response"] for r in rows]
