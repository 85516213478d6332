"""Does a GGUF base load, convert and still write code? Loads the file twice on the CPU: as the autoregressive model
transformers reads (`AutoModelForCausalLM`, float32) and through `training.convert.load_base` (the path of
`train_pipeline_gpu.py --gguf` and `training.stages convert --base`: the converted `SDARForCausalLM`, shift kept);
decodes a short code prompt greedily with both (the converted one autoregressively and one token a block, which must
agree with the source: NOTES §4), saves the converted checkpoint and loads it back (same logits?), and reports
times, peak memory and the answers.

    python benchmarks/gguf_base_check.py /tmp/qwen/qwen2.5-coder-0.5b-instruct.gguf --json /tmp/qwen/check.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from training.convert import load_base  # noqa: E402
from training.generate import autoregressive_generate, block_diffusion_generate  # noqa: E402

PROMPT = "Write a CUDA kernel that adds two float arrays of length n element-wise."


def peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # ru_maxrss is KiB on Linux


def check(path: Path, new_tokens: int, prompt: str) -> dict:
    report: dict = dict(file=str(path), bytes=path.stat().st_size, torch=torch.__version__,
                        threads=torch.get_num_threads())
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    source = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    report["source"] = dict(load_s=round(time.perf_counter() - started, 1), peak_rss_gib=peak_rss_gib(),
                            model_type=source.config.model_type, parameters=sum(p.numel() for p in source.parameters()),
                            tie_word_embeddings=source.config.tie_word_embeddings, vocab_size=source.config.vocab_size,
                            tokenizer_len=len(tokenizer))
    messages = [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    started = time.perf_counter()
    with torch.no_grad():
        out = source.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
    source_tokens = out[0, len(ids):].tolist()
    report["source"].update(generate_s=round(time.perf_counter() - started, 1), prompt_tokens=len(ids),
                            answer=tokenizer.decode(source_tokens))
    del source

    started = time.perf_counter()
    model, tokenizer = load_base(str(path), dtype=torch.float32)
    report["converted"] = dict(load_and_convert_s=round(time.perf_counter() - started, 1),
                               peak_rss_gib=peak_rss_gib(), config={k: getattr(model.config, k) for k in (
                                   "qkv_bias", "attention_bias", "use_qk_norm", "tie_word_embeddings",
                                   "prediction_shift", "block_size", "vocab_size", "mask_token_id", "head_dim")},
                               parameters=sum(p.numel() for p in model.parameters()))
    started = time.perf_counter()
    ar = autoregressive_generate(model, [ids], new_tokens, cuda_graph=False).tokens[0].tolist()
    report["converted"]["autoregressive_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    one_a_block = block_diffusion_generate(model, [ids], new_tokens, block_size=1, strategy="static").tokens[0].tolist()
    report["converted"]["block_of_one_s"] = round(time.perf_counter() - started, 1)
    agree = [len(source_tokens)]
    for tokens in (ar, one_a_block):
        common = min(len(tokens), len(source_tokens))
        agree.append(next((i for i in range(common) if tokens[i] != source_tokens[i]), common))
    report["converted"].update(answer_autoregressive=tokenizer.decode(ar), answer_block_of_one=tokenizer.decode(
        one_a_block), tokens_equal_to_source_autoregressive=agree[1], tokens_equal_to_source_block_of_one=agree[2],
        source_tokens=agree[0], peak_rss_gib=peak_rss_gib())

    with tempfile.TemporaryDirectory() as saved:
        started = time.perf_counter()
        model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        save_s = round(time.perf_counter() - started, 1)
        checkpoint_bytes = sum(f.stat().st_size for f in Path(saved).iterdir())
        started = time.perf_counter()
        reloaded, _ = load_base(saved, dtype=torch.float32)
        load_s = round(time.perf_counter() - started, 1)
        with torch.no_grad():
            difference = (model(torch.tensor([ids])).logits - reloaded(torch.tensor([ids])).logits).abs().max()
        report["round_trip"] = dict(save_s=save_s, checkpoint_bytes=checkpoint_bytes, load_s=load_s,
                                    qkv_bias=reloaded.config.qkv_bias, max_logit_difference=difference.item(),
                                    peak_rss_gib=peak_rss_gib())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = check(args.gguf, args.new_tokens, args.prompt)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
