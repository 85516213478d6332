"""Training throughput of block-diffusion SFT against plain autoregressive training of the same model (Qwen3-0.6B
shape, bf16 autocast, length 2048), in clean (sample) tokens per second, with MFU. One process, same weights and
optimizer; every variant prints its ratio against the AR baseline measured here.

Variants: `ar` (causal SDPA, next-token CE), `bd_full` (BD3-LM/SDAR layout: every sample as [x_t ; x_0], 2L tokens,
flex attention), `bd_packed` (noisy blocks with no masked token dropped, first-fit-decreasing packing; BlockMask by
create_block_mask over the whole grid), `bd_packed_layout` (the same packing, BlockMask built from the packed layout),
`bd_packed_intervals` (the same BlockMask, its partial tiles evaluating the mask in interval form: what training
uses) and `bd_tiled` (tile-aware packing: noisy runs topped up to whole 128-token tiles with unscored noisy blocks and
every segment starting on a tile boundary; not in the default set). All block-diffusion variants compute the same
loss.
All variants apply the LM head only where the loss is taken. The block-mask build is inside the timed step.

    python benchmarks/train_throughput.py --json results.json              # H200, about 2 minutes
    python benchmarks/train_throughput.py --device cpu --preset tiny --bd-row-length 4096 --steps 1 --warmup 1
    python benchmarks/train_throughput.py --tile-report                    # CPU: flex tiles per layout, mask build
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU image runs the checkout, not an install

import torch  # noqa: E402

from training.configuration_sdar import preset_config  # noqa: E402
from training.diffusion import (TokenizedSample, autoregressive_loss, block_diffusion_loss, block_diffusion_mask_mod,  # noqa: E402
                                block_mask_from_layout, build_attention_mask, noise_sample, pack_segments,
                                tile_structure)
from training.modeling_sdar import SDARForCausalLM, set_flex_compile_mode  # noqa: E402

H200_BF16_DENSE_PEAK = 989e12  # FLOP/s, NVIDIA's H200 SXM dense bf16 figure
FLEX_TILE = 128

# Block-diffusion variants: drop unscored noisy blocks, tile-aware packing, BlockMask built from the layout.
# layout_mask: the BlockMask's tiles come from the packed layout, its partial tiles evaluating that mask_mod form.
BD_VARIANTS = {
    "bd_full": {"drop_unscored_blocks": False, "tile": None, "layout_mask": None},
    "bd_packed": {"drop_unscored_blocks": True, "tile": None, "layout_mask": None},
    "bd_packed_layout": {"drop_unscored_blocks": True, "tile": None, "layout_mask": "segments"},
    "bd_packed_intervals": {"drop_unscored_blocks": True, "tile": None, "layout_mask": "intervals"},
    "bd_tiled": {"drop_unscored_blocks": True, "tile": FLEX_TILE, "layout_mask": "intervals"},
    # bd_packed_intervals with flex compiled under max-autotune (its kernel configurations benchmarked at first call)
    "bd_packed_intervals_autotune": {"drop_unscored_blocks": True, "tile": None, "layout_mask": "intervals",
                                     "flex_mode": "max-autotune-no-cudagraphs"},
}
DEFAULT_VARIANTS = ["ar", "bd_full", "bd_packed", "bd_packed_layout", "bd_packed_intervals"]


def synthetic_samples(count: int, length: int, prompt_fraction: float, vocab_size: int, generator) -> list:
    """Random-token samples: attention cost depends on the layout, not on the token values."""
    prompt_length = int(round(prompt_fraction * length))
    answer = torch.arange(length) >= prompt_length
    return [TokenizedSample(torch.randint(10, vocab_size, (length,), generator=generator), answer.clone())
            for _ in range(count)]


def ar_flops_per_token(config, length: int) -> float:
    """Training FLOPs a clean token costs in AR training: 6 x matmul params (LM head included) + causal attention."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    attn_width = config.num_attention_heads * config.head_dim
    kv_width = config.num_key_value_heads * config.head_dim
    per_layer = hidden * (2 * attn_width + 2 * kv_width) + 3 * hidden * config.intermediate_size
    matmul_params = layers * per_layer + hidden * config.vocab_size
    return 6 * matmul_params + 6 * layers * length * attn_width


def block_diffusion_batches(args, prompt_fraction: float, config, generator, drop_unscored_blocks: bool,
                            tile: int | None):
    """Packed batches of fresh samples, as the training loop sees them: enough noised samples that the rows fill
    up, the ones that do not fit waiting (already noised) for the next batch."""
    pending: list = []
    capacity = args.bd_rows * args.bd_row_length
    while True:
        while sum(s.length for s in pending) < args.pending * capacity:
            for sample in synthetic_samples(4, args.length, prompt_fraction, config.vocab_size, generator):
                pending.append(noise_sample(sample, args.block_size, generator, drop_unscored_blocks))
        batch, leftover = pack_segments(pending, config.mask_token_id, args.block_size, args.bd_row_length,
                                        max_rows=args.bd_rows, tile=tile)
        pending[:] = leftover
        yield batch


def measure(step, warmup: int, steps: int, device: torch.device) -> tuple[float, int]:
    """(seconds, clean tokens) over `steps` timed calls of `step()` (which returns the clean tokens it trained)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    synchronize()
    started = time.perf_counter()
    tokens = sum(step() for _ in range(steps))
    synchronize()
    return time.perf_counter() - started, tokens


def tile_report(args, config) -> list[dict]:
    """CPU only, no model: for each block-diffusion layout, flex's 128x128 tiles (partial: mask evaluated element by
    element; full: no mask work) per 1k clean tokens, the padding share, and the BlockMask build time of
    create_block_mask (uncompiled, on the grid) against the build from the layout, on the same batch."""
    from torch.nn.attention.flex_attention import create_block_mask

    rows = []
    for prompt_fraction in args.prompt_fraction:
        # The layout-mask variants pack like bd_packed: the same tiles.
        for variant in [v for v in args.variants if v in BD_VARIANTS and not v.startswith("bd_packed_")]:
            options = BD_VARIANTS[variant]
            generator = torch.Generator().manual_seed(0)
            stream = block_diffusion_batches(args, prompt_fraction, config, generator,
                                             options["drop_unscored_blocks"], options["tile"])
            partial = full = clean = samples = padding = cells = 0
            for _ in range(args.report_batches):
                batch = next(stream)
                batch_partial, batch_full = tile_structure(batch, args.block_size, FLEX_TILE)
                partial, full = partial + int(batch_partial.sum()), full + int(batch_full.sum())
                clean, samples = clean + batch.num_clean_tokens, samples + batch.num_samples
                padding, cells = padding + int((batch.segment_ids < 0).sum()), cells + batch.segment_ids.numel()
            layout_ms = float("inf")
            for _ in range(3):  # best of three: the first call pays for warming up the allocator
                started = time.perf_counter()
                block_mask_from_layout(batch, args.block_size, FLEX_TILE)
                layout_ms = min(layout_ms, 1000 * (time.perf_counter() - started))
            grid_ms = None
            if args.bd_row_length <= args.report_grid_max_length:  # the grid build needs ~ (row length)^2 bytes x 16
                mask_mod = block_diffusion_mask_mod(batch.segment_ids, batch.block_ids, batch.is_noisy)
                started = time.perf_counter()
                create_block_mask(mask_mod, B=batch.input_ids.shape[0], H=None, Q_LEN=args.bd_row_length,
                                  KV_LEN=args.bd_row_length, device="cpu")
                grid_ms = round(1000 * (time.perf_counter() - started), 1)
            row = dict(variant=variant, prompt_fraction=prompt_fraction,
                       samples_per_row=round(samples / (args.report_batches * args.bd_rows), 2),
                       padding_share=round(padding / cells, 3),
                       partial_tiles_per_1k_clean=round(1000 * partial / clean, 1),
                       full_tiles_per_1k_clean=round(1000 * full / clean, 1),
                       partial_share=round(partial / (partial + full), 3),
                       layout_mask_ms=round(layout_ms, 1), create_block_mask_ms=grid_ms)
            rows.append(row)
            print(f"{variant:10s} prompt {prompt_fraction:.2f}: {row['samples_per_row']:5.2f} samples/row, "
                  f"padding {row['padding_share']:.1%}, tiles per 1k clean tokens: "
                  f"{row['partial_tiles_per_1k_clean']} partial + {row['full_tiles_per_1k_clean']} full "
                  f"({row['partial_share']:.0%} partial); BlockMask from layout {row['layout_mask_ms']} ms, "
                  f"create_block_mask {grid_ms} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="0.6B")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--prompt-fraction", type=float, nargs="+", default=[0.0, 0.35])
    parser.add_argument("--ar-rows", type=int, default=8, help="AR batch: rows of --length tokens")
    # One long row: segments (2048 clean + 0..2048 noisy tokens) pack with little waste only when a row holds many.
    parser.add_argument("--bd-rows", type=int, default=1, help="block-diffusion batch: rows of --bd-row-length")
    parser.add_argument("--bd-row-length", type=int, default=32768)
    parser.add_argument("--pending", type=float, default=1.5,
                        help="noised samples kept ready for packing, in multiples of a batch's tokens")
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps per variant (clean tokens a step vary with the noise draw: with 4 steps the "
                             "ratio moved by ~3%% between runs)")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=["ar", *BD_VARIANTS])
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--device", default="cuda", help="cpu only for a dry run (dense attention, tiny preset)")
    parser.add_argument("--tile-report", action="store_true", help="count flex tiles per layout on the CPU instead")
    parser.add_argument("--report-batches", type=int, default=4)
    parser.add_argument("--report-grid-max-length", type=int, default=16384,
                        help="time create_block_mask on the CPU only up to this row length (memory)")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = preset_config(args.preset, block_size=args.block_size)
    if args.tile_report:
        print(f"flex tiles of {FLEX_TILE}x{FLEX_TILE} | torch {torch.__version__} | rows of {args.bd_row_length}, "
              f"samples of {args.length}, block {args.block_size}")
        write_json(args, "cpu", tile_report(args, config))
        return

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    attention_backend = "flex" if on_gpu else "dense"
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    with device:  # initialise on the device: 0.6B parameters initialised on a CPU take a while
        model = SDARForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=on_gpu)
    generator = torch.Generator().manual_seed(0)
    flops_per_token = ar_flops_per_token(config, args.length)
    print(f"{device_name} | torch {torch.__version__} | {args.preset} "
          f"({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params) | length {args.length} | bf16 autocast")

    def train_on(loss_fn) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            loss = loss_fn()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    results = []
    for prompt_fraction in args.prompt_fraction:
        def ar_step() -> int:
            samples = synthetic_samples(args.ar_rows, args.length, prompt_fraction, config.vocab_size, generator)
            ids = torch.stack([s.input_ids for s in samples]).to(device, non_blocking=True)
            answer = torch.stack([s.answer_mask for s in samples]).to(device, non_blocking=True)
            train_on(lambda: autoregressive_loss(model, ids, answer))
            return ids.numel()

        def bd_step_factory(drop_unscored_blocks: bool, tile: int | None, layout_mask: str | None,
                            flex_mode: str | None = None):
            batches = block_diffusion_batches(args, prompt_fraction, config, generator, drop_unscored_blocks, tile)

            def bd_step() -> int:
                set_flex_compile_mode(flex_mode)
                batch = next(batches).to(device)
                # The layout-built BlockMask is computed on the device from the packed tensors, inside the step.
                mask = build_attention_mask(batch, attention_backend, args.block_size if layout_mask else None,
                                            mask_mod_form=layout_mask or "intervals")
                train_on(lambda: block_diffusion_loss(model, batch, mask))
                return batch.num_clean_tokens

            return bd_step

        steps = {"ar": ar_step, **{name: bd_step_factory(**options) for name, options in BD_VARIANTS.items()}}
        baseline = None
        for variant in args.variants:
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            try:
                seconds, tokens = measure(steps[variant], args.warmup, args.steps, device)
            except Exception as error:  # report and go on: one failing variant must not hide the others
                print(f"{variant:16s} prompt {prompt_fraction:.2f}: FAILED {type(error).__name__}: {error}")
                continue
            tokens_per_second = tokens / seconds
            baseline = tokens_per_second if variant == "ar" else baseline
            row = dict(variant=variant, prompt_fraction=prompt_fraction, clean_tokens_per_s=round(tokens_per_second),
                       ratio_vs_ar=round(tokens_per_second / baseline, 3) if baseline else None,
                       mfu_ar_equivalent=round(tokens_per_second * flops_per_token / H200_BF16_DENSE_PEAK, 3),
                       step_ms=round(1000 * seconds / args.steps, 1),
                       wall_s=round(time.perf_counter() - started, 1),
                       peak_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if on_gpu else None)
            results.append(row)
            write_json(args, device_name, results)  # after every variant: a run cut short keeps what it measured
            print(f"{variant:16s} prompt {prompt_fraction:.2f}: {row['clean_tokens_per_s']:>8} clean tok/s  "
                  f"ratio vs AR {row['ratio_vs_ar']}  MFU(AR-equiv) {row['mfu_ar_equivalent']:.1%}  "
                  f"{row['step_ms']} ms/step  {row['peak_memory_gib']} GiB  (variant took {row['wall_s']} s, "
                  f"compiled graphs so far: {torch._dynamo.utils.counters['stats']['unique_graphs']})", flush=True)
    write_json(args, device_name, results)


def write_json(args, device_name: str, results: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           device=device_name, torch=torch.__version__, args=vars(args),
                           results=results), handle, indent=2)


if __name__ == "__main__":
    main()
