"""`dice generate TASK.py --checkpoint DIR`: write a CUDA `ModelNew` for one KernelBench-format task with a
block-diffusion checkpoint (SDAR/DICE directory, ours, or a Llama/Qwen3 checkpoint converted on the fly), using the
KernelBench one-shot prompt in the checkpoint's chat template. Prints (or saves) the extracted kernel file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dice_pipeline.cli import summary


def register(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate a CUDA kernel for a KernelBench task file",
                                   description=summary(__doc__))
    parser.add_argument("task", type=Path, help="KernelBench-format PyTorch file (class Model, get_inputs, ...)")
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="model directory (with its tokenizer), or a .gguf file")
    parser.add_argument("--decoder", choices=["block", "autoregressive"], default="block")
    parser.add_argument("--strategy", choices=["static", "dynamic"], default=None,
                        help="unmasking: static top-k a step (DICE's evaluation) or dynamic confidence threshold; "
                             "default static, or dynamic when --confidence-threshold is given")
    parser.add_argument("--block-size", type=int, default=None, help="default: the checkpoint's block_size")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps a block (default: block size)")
    parser.add_argument("--confidence-threshold", type=float, default=None,
                        help="dynamic unmasking: commit every token more confident than this (e.g. 0.9)")
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (DICE's evaluation)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--output", type=Path, default=None, help="write the extracted kernel file here")
    parser.add_argument("--response-output", type=Path, default=None, help="write the model's full answer here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_generate)


def build_prompt_ids(tokenizer, pytorch_code: str) -> list[int]:
    """The KernelBench one-shot prompt as chat turns, rendered by the checkpoint's template (ours if it has none)."""
    from dice_pipeline.prompts import kernel_generation_messages, render_chat

    messages = kernel_generation_messages(pytorch_code)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = render_chat(messages, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run_generate(args: argparse.Namespace) -> int:
    # Heavy imports here, so `dice --help` and other subcommands stay fast.
    import torch
    from tqdm import tqdm

    from dice_pipeline.prompts import extract_code_block
    from training.convert import load_pretrained_as_block_diffusion
    from training.generate import autoregressive_generate, block_diffusion_generate

    if not args.task.is_file():
        print(f"error: task file {args.task} not found", file=sys.stderr)
        return 2
    if not args.checkpoint.exists():
        print(f"error: checkpoint {args.checkpoint} not found", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, tokenizer = load_pretrained_as_block_diffusion(args.checkpoint, dtype=dtype)
    model.to(device)
    prompt_ids = build_prompt_ids(tokenizer, args.task.read_text(encoding="utf-8"))
    generator = torch.Generator(device=device).manual_seed(args.seed)
    common = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator,
                  eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    with tqdm(total=args.max_new_tokens, unit="tok", disable=args.quiet, file=sys.stderr,
              desc=f"generating ({args.decoder})") as bar:
        if args.decoder == "autoregressive":
            result = autoregressive_generate(model, [prompt_ids], args.max_new_tokens, progress=bar.update, **common)
        else:
            strategy = args.strategy or ("dynamic" if args.confidence_threshold is not None else "static")
            result = block_diffusion_generate(
                model, [prompt_ids], args.max_new_tokens, block_size=args.block_size, steps=args.steps,
                strategy=strategy,
                confidence_threshold=0.9 if args.confidence_threshold is None else args.confidence_threshold,
                progress=bar.update, **common)
    response = tokenizer.decode(result.tokens[0, : int(result.lengths[0])], skip_special_tokens=True)
    print(f"{int(result.lengths[0])} tokens in {result.num_forwards} forward passes", file=sys.stderr)
    if args.response_output is not None:
        args.response_output.write_text(response, encoding="utf-8")
    code = extract_code_block(response)
    if code is None:
        print("error: the answer contains no Python code block; full answer follows", file=sys.stderr)
        print(response)
        return 1
    if args.output is not None:
        args.output.write_text(code, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(code, end="")
    return 0
