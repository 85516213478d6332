"""Decoding throughput of dynamic block decoding against KV-cached autoregressive decoding of the same weights, at
batch 1 and 16, plus static block decoding (the published anchor: dynamic is 1.8-3.2x faster than static).

A realistic confidence profile needs a trained model, so this script first trains one: a byte-level BPE and a
`small` block-diffusion model (8 layers, d=512) trained for --train-seconds on Python source code found on the
machine (by default the installed torch package's own .py files; no data is downloaded). Prompts are the first
--prompt-tokens tokens of held-out files. EOS stopping is off so every decoder writes the same number of tokens.

    python benchmarks/decode_throughput.py --train-seconds 90
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from training.configuration_sdar import preset_config
from training.generate import autoregressive_generate, block_diffusion_generate
from training.modeling_sdar import SDARForCausalLM
from training.sft import SFTConfig, text_windows, train_block_diffusion
from training.tokenizer import train_bpe_tokenizer


def read_code_corpus(root: Path, max_bytes: int, seed: int = 0) -> list[str]:
    files = sorted(root.rglob("*.py"))
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) < 2000:  # tiny files (__init__ stubs) carry little code
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeats: int, device: torch.device):
    synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    synchronize(device)
    return (time.perf_counter() - started) / repeats, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path(torch.__file__).parent)
    parser.add_argument("--corpus-mb", type=float, default=8.0)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--train-seconds", type=float, default=90.0)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="denoising steps a block (static schedule)")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save-model", type=Path, default=None, help="save the trained model + tokenizer here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cpu only for a dry run of the script")
    args = parser.parse_args()
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    torch.manual_seed(0)

    started = time.perf_counter()
    texts = read_code_corpus(args.corpus, int(args.corpus_mb * 2**20))
    held_out = min(32, len(texts) // 4)  # prompts come from files the model never trained on
    heldout_texts, train_texts = texts[:held_out], texts[held_out:]
    tokenizer = train_bpe_tokenizer(train_texts, vocab_size=args.vocab_size)
    windows = text_windows(tokenizer, train_texts, args.window)
    print(f"corpus: {len(texts)} files, {sum(map(len, texts)) / 2**20:.1f} MiB from {args.corpus}; tokenizer "
          f"{len(tokenizer)} tokens; {len(windows)} windows of {args.window} ({time.perf_counter() - started:.0f}s)")

    config = preset_config(args.preset, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                           block_size=args.block_size, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
    model = SDARForCausalLM(config).to(device)
    history = train_block_diffusion(model, windows, SFTConfig(
        learning_rate=args.lr, warmup_ratio=0.02, epochs=100, max_seconds=args.train_seconds, rows_per_step=4,
        row_length=8 * args.window,
        attention_backend="dense"))  # dense SDPA: no compile time eaten out of the short training budget
    trained_tokens = sum(r["clean_tokens"] for r in history)
    print(f"trained {args.preset} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params) for "
          f"{len(history)} steps, {trained_tokens / 1e6:.1f}M clean tokens, {history[-1]['seconds']:.0f}s; "
          f"loss {history[0]['loss']:.2f} -> {sum(r['loss'] for r in history[-20:]) / len(history[-20:]):.2f} "
          f"(mean of the last 20 steps)")
    model = model.to(torch.bfloat16).eval()
    if args.save_model:
        model.save_pretrained(args.save_model)
        tokenizer.save_pretrained(args.save_model)

    prompts_all = [tokenizer(text, add_special_tokens=False)["input_ids"][: args.prompt_tokens]
                   for text in heldout_texts]
    common = dict(pad_token_id=tokenizer.pad_token_id)
    decoders = {
        "autoregressive": lambda p: autoregressive_generate(model, p, args.new_tokens, **common),
        "static": lambda p: block_diffusion_generate(model, p, args.new_tokens, strategy="static",
                                                     steps=args.steps, **common),
        "dynamic": lambda p: block_diffusion_generate(model, p, args.new_tokens, strategy="dynamic",
                                                      steps=args.steps, threshold=args.threshold, **common),
    }
    print(f"{device_name} | torch {torch.__version__} | bf16 | block {args.block_size}, "
          f"{args.steps} steps, threshold {args.threshold} | {args.new_tokens} new tokens, prompts of "
          f"{args.prompt_tokens} tokens | eager (no CUDA graphs)")
    results = []
    for batch_size in args.batch_sizes:
        prompts = prompts_all[:batch_size]
        speeds, outputs = {}, {}
        for name, decode in decoders.items():
            decode(prompts)  # warm-up (allocator, kernels)
            seconds, result = timed(lambda: decode(prompts), args.repeats, device)
            speeds[name] = batch_size * args.new_tokens / seconds
            outputs[name] = result.tokens
            results.append(dict(batch=batch_size, decoder=name, tokens_per_s=round(speeds[name], 1),
                                forwards=result.num_forwards,
                                tokens_per_forward=round(batch_size * args.new_tokens / result.num_forwards, 2),
                                ms_per_forward=round(1000 * seconds / result.num_forwards, 2)))
            print(f"batch {batch_size:2d} {name:14s} {speeds[name]:9.1f} tok/s  {result.num_forwards:4d} forwards  "
                  f"{1000 * seconds / result.num_forwards:.2f} ms/forward", flush=True)
        agreement = (outputs["dynamic"] == outputs["static"]).float().mean().item()
        print(f"batch {batch_size:2d} ratios: dynamic/AR {speeds['dynamic'] / speeds['autoregressive']:.2f}x  "
              f"static/AR {speeds['static'] / speeds['autoregressive']:.2f}x  "
              f"dynamic/static {speeds['dynamic'] / speeds['static']:.2f}x  "
              f"(dynamic output equals static on {agreement:.1%} of tokens)", flush=True)
        results.append(dict(batch=batch_size, dynamic_vs_ar=speeds["dynamic"] / speeds["autoregressive"],
                            static_vs_ar=speeds["static"] / speeds["autoregressive"],
                            dynamic_vs_static=speeds["dynamic"] / speeds["static"], token_agreement=agreement))
    sample = block_diffusion_generate(model, prompts_all[:1], 96, strategy="dynamic", threshold=args.threshold,
                                      **common)
    print("--- dynamic sample continuation of held-out prompt 0:\n" + tokenizer.decode(sample.tokens[0]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           device=device_name, torch=torch.__version__,
                           args={k: str(v) for k, v in vars(args).items()}, train_steps=len(history),
                           train_clean_tokens=trained_tokens, results=results), handle, indent=2)


if __name__ == "__main__":
    main()
