"""Decoding throughput of dynamic block decoding against KV-cached autoregressive decoding of the same weights, at
batch 1 and 16, plus static block decoding (the published anchor: dynamic is 1.8-3.2x faster than static).

A realistic confidence profile needs a trained model, so this script first trains one: a byte-level BPE and a
`small` block-diffusion model (8 layers, d=512) trained for --train-seconds with the block-diffusion objective only
(no AR loss) on Python source code found on the machine, no data downloaded. The default corpus is the installed
`transformers` package's .py files: low-entropy code (its model files share much copied code), so a model trained
for minutes gets confident enough to commit several tokens a forward; `--corpus <torch dir>` gives harder text.
Files identical to another are dropped; prompts are the first --prompt-tokens tokens of held-out files (never
trained on, picked by a seeded shuffle). EOS stopping is off so every decoder writes the same number of tokens.
Decoding steps are CUDA graphs for every decoder (`--also-eager` adds eager runs). Every ratio is against the AR
decoder measured in the same process.

`--init-from` starts from a pretrained model instead (a `.gguf` file such as SmolLM2-135M-Instruct's, or a local
checkpoint directory: training/convert.py), with its own tokenizer plus a mask token, and converts it with
--train-seconds of the same block-diffusion training (SDAR's recipe; 0 decodes the checkpoint as it is).

Quality cost: faster settings commit tokens on less confidence. Besides token agreement with static decoding, every
decoder's continuation is scored by the model itself: its block-diffusion loss on the continuation given the prompt
(fixed noise, `continuation_loss`, lower = text the model finds more likely), next to the same score for the
held-out file's true continuation.

    python benchmarks/decode_throughput.py --json decode.json     # H200: about 3.5 minutes (150 s of training)
    python benchmarks/decode_throughput.py --device cpu --preset tiny --train-seconds 5 --corpus-mb 0.3 \
        --new-tokens 16 --batch-sizes 1 2 --repeats 1 --vocab-size 512 --window 128   # CPU dry run
    python benchmarks/decode_throughput.py --init-from SmolLM2-135M-Instruct.Q4_1.gguf --lr 1e-4 \
        --train-seconds 240 --json decode.json                                       # converted SmolLM2
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU image runs the checkout, not an install

import torch  # noqa: E402

from training.blocks import prediction_shift  # noqa: E402
from training.configuration_sdar import preset_config  # noqa: E402
from training.convert import load_pretrained_as_block_diffusion  # noqa: E402
from training.corpus import read_code_corpus  # noqa: E402
from training.diffusion import (  # noqa: E402
    TokenizedSample,
    block_diffusion_loss,
    build_attention_mask,
    pack_block_diffusion,
)
from training.generate import autoregressive_generate, block_diffusion_generate  # noqa: E402
from training.modeling_sdar import SDARForCausalLM  # noqa: E402
from training.sft import continued_training_config, text_windows, train_block_diffusion  # noqa: E402
from training.tokenizer import train_bpe_tokenizer  # noqa: E402


def default_corpus() -> Path:
    import transformers

    return Path(transformers.__file__).parent


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


def heldout_loss(model, windows, device, block_size: int, mask_token_id: int) -> float:
    """Block-diffusion loss on held-out windows with fixed noise (how confident the model is where it decodes)."""
    batch = pack_block_diffusion(windows, mask_token_id, block_size, 8 * windows[0].input_ids.numel(),
                                 torch.Generator().manual_seed(0), shift=prediction_shift(model.config)).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return block_diffusion_loss(model, batch, build_attention_mask(batch, "dense")).item()


def continuation_loss(model, prompts, continuations, device, seeds: int = 4) -> float:
    """The model's block-diffusion loss on `continuations` given `prompts` (only continuation tokens are masked and
    scored), averaged over `seeds` fixed noise draws: how likely the model finds a decoded (or true) continuation."""
    samples = []
    for prompt, continuation in zip(prompts, continuations):
        ids = torch.tensor(list(prompt) + [int(t) for t in continuation], dtype=torch.long)
        samples.append(TokenizedSample(ids, torch.arange(ids.numel()) >= len(prompt)))
    block_size = model.config.block_size
    row_length = 2 * (max(s.input_ids.numel() for s in samples) + 2 * block_size)
    total = 0.0
    for seed in range(seeds):
        batch = pack_block_diffusion(samples, model.config.mask_token_id, block_size, row_length,
                                     torch.Generator().manual_seed(seed), shift=prediction_shift(model.config)).to(device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            total += block_diffusion_loss(model, batch, build_attention_mask(batch, "dense")).item()
    return total / seeds


def modes_label(graphed: bool, device: torch.device) -> str:
    return "graph" if graphed and device.type == "cuda" else "eager"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, nargs="+", default=None,
                        help="folders of .py files (default: the installed transformers package)")
    parser.add_argument("--corpus-mb", type=float, default=24.0)
    parser.add_argument("--prompt-corpus", type=Path, nargs="+", default=None,
                        help="take the prompts (and the held-out loss) from every .py file here instead, all held out "
                             "(e.g. kernel files a checkpoint never trained on); --corpus then only feeds training")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start from this pretrained model (.gguf file or checkpoint directory) and its "
                             "tokenizer instead of a new BPE and a random --preset model")
    parser.add_argument("--train-seconds", type=float, default=150.0)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--rows-per-step", type=int, default=8, help="training batch: rows of 8 x --window tokens")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak; cosine decay to a tenth over the run")
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="denoising steps a block (static schedule)")
    parser.add_argument("--threshold", type=float, default=0.9, help="dynamic unmasking confidence threshold")
    parser.add_argument("--sweep-thresholds", type=float, nargs="*", default=[0.5, 0.7, 0.8, 0.95],
                        help="batch 1: also time dynamic decoding at these thresholds (speed against the AR run, "
                             "token agreement with static decoding as the quality cost)")
    parser.add_argument("--kernelbench-prompts", type=Path, default=None,
                        help="KernelBench tasks (tasks.jsonl or a checkout): the prompts are their level-1 kernel "
                             "generation chat prompts, as the evaluation asks them (what an SFT checkpoint answers), "
                             "all held out; --corpus then only feeds training")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--prompt-min-chars", type=int, default=2000,
                        help="--prompt-corpus files shorter than this are skipped (room for prompt + continuation)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--batch1-prompts", type=int, default=4,
                        help="batch 1 is timed over this many held-out prompts, decoded one after another")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--also-eager", action="store_true", help="also time every decoder without CUDA graphs")
    parser.add_argument("--save-model", type=Path, default=None, help="save the trained model + tokenizer here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cpu only for a dry run of the script")
    args = parser.parse_args()
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    torch.manual_seed(0)

    started = time.perf_counter()
    corpus = args.corpus or [default_corpus()]
    if args.kernelbench_prompts:
        from dice_pipeline.kernelbench import load_kernelbench_tasks

        kernelbench_tasks = load_kernelbench_tasks(args.kernelbench_prompts, levels=[1]).tasks
        random.Random(0).shuffle(kernelbench_tasks)
        if not kernelbench_tasks:
            parser.error(f"no level-1 task in {args.kernelbench_prompts}")
        heldout_texts = [task.code for task in kernelbench_tasks]
        train_texts = read_code_corpus(corpus, int(args.corpus_mb * 2**20)) if args.train_seconds > 0 else []
        texts, held_out = heldout_texts + train_texts, len(heldout_texts)
    elif args.prompt_corpus:
        # every prompt file is held out; the training corpus is read only where there is training
        heldout_texts = read_code_corpus(args.prompt_corpus, 2**40, min_chars=args.prompt_min_chars)
        if not heldout_texts:
            parser.error(f"no .py file of {args.prompt_min_chars}+ characters under {args.prompt_corpus}")
        train_texts = read_code_corpus(corpus, int(args.corpus_mb * 2**20)) if args.train_seconds > 0 else []
        texts, held_out = heldout_texts + train_texts, len(heldout_texts)
    else:
        texts = read_code_corpus(corpus, int(args.corpus_mb * 2**20))
        held_out = min(32, len(texts) // 4)  # prompts come from files the model never trained on
        heldout_texts, train_texts = texts[:held_out], texts[held_out:]
    if args.init_from:
        model, tokenizer = load_pretrained_as_block_diffusion(args.init_from, block_size=args.block_size)
        model = model.float().to(device)
        origin = f"{args.init_from.name} (pretrained, loaded as SDAR)"
    else:
        tokenizer = train_bpe_tokenizer(train_texts, vocab_size=args.vocab_size)
    windows = text_windows(tokenizer, train_texts, args.window) if train_texts else []
    heldout_windows = text_windows(tokenizer, heldout_texts, args.window)[:16]
    corpus_line = (f"{len(texts)} distinct .py files, {sum(map(len, texts)) / 2**20:.1f} MiB from "
                   f"{', '.join(map(str, corpus))} ({held_out} held out)")
    if args.prompt_corpus or args.kernelbench_prompts:
        what = (f"the kernel generation chat prompts of {held_out} KernelBench level-1 tasks from "
                f"{args.kernelbench_prompts}" if args.kernelbench_prompts else
                f"{held_out} .py files, {sum(map(len, heldout_texts)) / 2**20:.2f} MiB from "
                f"{', '.join(map(str, args.prompt_corpus))}")
        corpus_line = (f"prompts: {what} (all held out); training: {len(train_texts)} files from "
                       f"{', '.join(map(str, corpus))}")
    print(f"corpus: {corpus_line}; tokenizer {len(tokenizer)} tokens; {len(windows)} windows of {args.window} "
          f"({time.perf_counter() - started:.0f}s)", flush=True)

    if not args.init_from:
        config = preset_config(args.preset, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                               block_size=args.block_size, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id)
        model = SDARForCausalLM(config).to(device)
        origin = f"{args.preset} random init"
    mask_token_id = model.config.mask_token_id
    loss_before = heldout_loss(model, heldout_windows, device, args.block_size, mask_token_id)
    history = []
    if args.train_seconds > 0:
        history = train_block_diffusion(model, windows, continued_training_config(
            args.lr, args.train_seconds, args.window, args.rows_per_step, args.warmup_steps))["history"]
    trained_tokens = sum(r["clean_tokens"] for r in history)
    train_loss = sum(r["loss"] for r in history[-20:]) / len(history[-20:]) if history else None
    loss_after = heldout_loss(model, heldout_windows, device, args.block_size, mask_token_id)
    epochs = trained_tokens / max(1, len(windows) * args.window)
    model_line = (f"{origin} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), block-diffusion "
                  f"loss only, lr {args.lr:g} cosine to {args.lr / 10:g}, {len(history)} steps, "
                  f"{trained_tokens / 1e6:.1f}M clean tokens ({epochs:.1f} epochs), "
                  f"{history[-1]['seconds'] if history else 0:.0f}s")
    first_loss = history[0]["loss"] if history else None
    if history:
        print(f"trained {model_line}; train loss {first_loss:.2f} -> {train_loss:.2f} (mean of the last 20 "
              f"steps); held-out loss {loss_before:.2f} -> {loss_after:.2f}", flush=True)
    else:
        print(f"not trained (--train-seconds 0): {origin}; held-out loss {loss_after:.2f}", flush=True)
    model = model.to(torch.bfloat16).eval()
    if args.save_model:
        model.save_pretrained(args.save_model)
        tokenizer.save_pretrained(args.save_model)

    heldout_ids = tokenizer(heldout_texts, add_special_tokens=False)["input_ids"]
    prompts_all = [ids[: args.prompt_tokens] for ids in heldout_ids]
    if args.kernelbench_prompts:  # whole chat prompts; no file continuation to compare with
        from dice_pipeline.prompts import kernel_generation_messages

        prompts_all = [tokenizer(tokenizer.apply_chat_template(kernel_generation_messages(text), tokenize=False,
                                                               add_generation_prompt=True),
                                 add_special_tokens=False)["input_ids"] for text in heldout_texts]
        heldout_ids = [[] for _ in heldout_texts]
    prompt_line = (f"KernelBench chat prompts of {min(map(len, prompts_all))}-{max(map(len, prompts_all))} tokens"
                   if args.kernelbench_prompts else f"prompts of {args.prompt_tokens} tokens")
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    common = dict(pad_token_id=pad_token_id)
    block = dict(steps=args.steps, confidence_threshold=args.threshold, **common)
    decoders = {  # name -> decode(prompts, cuda_graph, graphs)
        "autoregressive": lambda p, g, graphs: autoregressive_generate(model, p, args.new_tokens, cuda_graph=g,
                                                                      graphs=graphs, **common),
        "static": lambda p, g, graphs: block_diffusion_generate(model, p, args.new_tokens, strategy="static",
                                                                cuda_graph=g, graphs=graphs, **block),
        "dynamic": lambda p, g, graphs: block_diffusion_generate(model, p, args.new_tokens, strategy="dynamic",
                                                                 cuda_graph=g, graphs=graphs, **block),
    }
    modes = [True, False] if args.also_eager and device.type == "cuda" else [True]
    graph_note = "CUDA graphs" if device.type == "cuda" else "eager (CPU)"
    print(f"{device_name} | torch {torch.__version__} | bf16 | block {args.block_size}, {args.steps} steps, "
          f"threshold {args.threshold} | {args.new_tokens} new tokens, {prompt_line} | "
          f"batch 1 over {args.batch1_prompts} prompts one after another | {graph_note}", flush=True)

    def prompt_groups(batch_size: int) -> list[list[list[int]]]:
        """Batch 1 decodes --batch1-prompts prompts one at a time (a single prompt's confidence is too noisy a
        sample); a larger batch decodes its first `batch_size` prompts together."""
        if batch_size == 1:
            return [[prompt] for prompt in prompts_all[: args.batch1_prompts]]
        return [prompts_all[:batch_size]] if len(prompts_all) >= batch_size else []

    def run_groups(decode, groups, graphed: bool):
        """Time `decode` over every group (the first pass captures the graphs, timed passes replay them); returns
        seconds for all groups, total forwards, and the tokens of all groups stacked."""
        graphs: dict = {}
        def run_all():
            return [decode(group, graphed, graphs) for group in groups]

        run_all()
        seconds, outs = timed(run_all, args.repeats, device)
        return seconds, sum(o.num_forwards for o in outs), torch.cat([o.tokens for o in outs])

    def quality(groups, tokens) -> float:
        return continuation_loss(model, [p for group in groups for p in group], tokens.tolist(), device)

    truth_score = {}  # batch size -> the held-out files' true continuations, scored the same way
    results, ratios = [], []
    outputs_by_batch: dict[int, torch.Tensor] = {}  # static decoding's tokens: the sweep's quality reference
    for batch_size in args.batch_sizes:
        groups = prompt_groups(batch_size)
        if not groups:
            print(f"batch {batch_size}: only {len(prompts_all)} held-out prompts; skipped")
            continue
        rows = sum(len(group) for group in groups)
        long_enough = [len(ids) >= args.prompt_tokens + args.new_tokens for ids in heldout_ids[:rows]]
        if all(long_enough):
            truth = [ids[args.prompt_tokens: args.prompt_tokens + args.new_tokens] for ids in heldout_ids[:rows]]
            truth_score[batch_size] = quality(groups, torch.tensor(truth))
        for graphed in modes:
            mode = modes_label(graphed, device)
            speeds, outputs, scores = {}, {}, {}
            for name, decode in decoders.items():
                seconds, forwards, tokens = run_groups(decode, groups, graphed)
                speeds[name] = rows * args.new_tokens / seconds
                outputs[name] = tokens
                scores[name] = quality(groups, tokens)
                per_forward = len(groups) * args.new_tokens / forwards  # tokens a row commits per forward
                results.append(dict(batch=batch_size, mode=mode, decoder=name, tokens_per_s=round(speeds[name], 1),
                                    forwards=forwards, tokens_per_forward=round(per_forward, 2),
                                    ms_per_forward=round(1000 * seconds / forwards, 3),
                                    continuation_loss=round(scores[name], 4)))
                print(f"batch {batch_size:2d} {mode:5s} {name:14s} {speeds[name]:9.1f} tok/s  "
                      f"{forwards:4d} forwards ({per_forward:.2f} tokens a row a forward)  "
                      f"{1000 * seconds / forwards:.3f} ms/forward  continuation loss {scores[name]:.3f}", flush=True)
            if mode == modes_label(modes[0], device):
                outputs_by_batch[batch_size] = outputs["static"]
            agreement = {pair: round((outputs[pair[0]] == outputs[pair[1]]).float().mean().item(), 3)
                         for pair in (("dynamic", "static"), ("dynamic", "autoregressive"),
                                      ("static", "autoregressive"))}
            summary = dict(batch=batch_size, mode=mode,
                           dynamic_vs_ar=round(speeds["dynamic"] / speeds["autoregressive"], 3),
                           static_vs_ar=round(speeds["static"] / speeds["autoregressive"], 3),
                           dynamic_vs_static=round(speeds["dynamic"] / speeds["static"], 3),
                           agreement={f"{a}={b}": value for (a, b), value in agreement.items()},
                           true_continuation_loss=truth_score.get(batch_size))
            ratios.append(summary)
            truth_note = (f"; true continuation loss {truth_score[batch_size]:.3f}"
                          if batch_size in truth_score else "")
            print(f"batch {batch_size:2d} {mode:5s} ratios: dynamic/AR {summary['dynamic_vs_ar']:.2f}x  "
                  f"static/AR {summary['static_vs_ar']:.2f}x  dynamic/static {summary['dynamic_vs_static']:.2f}x  "
                  f"| same token as: " + ", ".join(f"{a}~{b} {v:.1%}" for (a, b), v in agreement.items())
                  + truth_note, flush=True)
    sweep = []
    ar_batch1 = next((r for r in results if r["batch"] == 1 and r["decoder"] == "autoregressive"
                      and r["mode"] == modes_label(True, device)), None)
    static_batch1 = outputs_by_batch.get(1)
    for threshold in args.sweep_thresholds if ar_batch1 and static_batch1 is not None else []:
        groups = prompt_groups(1)
        def decode(p, g, graphs, threshold=threshold):
            return block_diffusion_generate(model, p, args.new_tokens, strategy="dynamic", cuda_graph=g,
                                            graphs=graphs, **{**block, "confidence_threshold": threshold})

        seconds, forwards, tokens = run_groups(decode, groups, True)
        row = dict(threshold=threshold, tokens_per_s=round(len(groups) * args.new_tokens / seconds, 1),
                   vs_ar=round(len(groups) * args.new_tokens / seconds / ar_batch1["tokens_per_s"], 3),
                   tokens_per_forward=round(len(groups) * args.new_tokens / forwards, 2),
                   same_token_as_static=round((tokens == static_batch1).float().mean().item(), 3),
                   continuation_loss=round(quality(groups, tokens), 4))
        sweep.append(row)
        print(f"batch  1 dynamic threshold {threshold:<5g} {row['tokens_per_s']:9.1f} tok/s  vs AR "
              f"{row['vs_ar']:.2f}x  {row['tokens_per_forward']:.2f} tokens a forward  same token as static "
              f"{row['same_token_as_static']:.1%}  continuation loss {row['continuation_loss']:.3f}", flush=True)
    sample = block_diffusion_generate(model, prompts_all[:1], 96, strategy="dynamic",
                                      confidence_threshold=args.threshold, **common)
    print("--- dynamic sample continuation of held-out prompt 0:\n" + tokenizer.decode(sample.tokens[0]))
    print(f"total {time.perf_counter() - started:.0f}s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           device=device_name, torch=torch.__version__,
                           args={k: str(v) for k, v in vars(args).items()}, corpus=corpus_line, model=model_line,
                           train_steps=len(history), train_clean_tokens=trained_tokens,
                           train_loss_first=first_loss, train_loss_last20=train_loss,
                           heldout_loss_before=loss_before, heldout_loss_after=loss_after,
                           results=results, ratios=ratios, threshold_sweep=sweep, true_continuation_loss=truth_score,
                           seconds=round(time.perf_counter() - started)),
                      handle, indent=2)


if __name__ == "__main__":
    main()
