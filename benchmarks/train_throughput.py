"""Training throughput of block-diffusion SFT against plain autoregressive training of the same model (Qwen3-0.6B
shape, bf16 autocast, length 2048), in clean (sample) tokens per second, with MFU. One process, same weights and
optimizer; every variant prints its ratio against the AR baseline measured here.

Variants: `ar` (causal SDPA, next-token CE), `bd_full` (BD3-LM/SDAR layout: every sample as [x_t ; x_0], 2L tokens,
flex attention), `bd_packed` (ours: noisy blocks with no masked token dropped, first-fit-decreasing packing).
All variants apply the LM head only where the loss is taken. The block-mask build is inside the timed step.

    python benchmarks/train_throughput.py --prompt-fraction 0.0 0.35
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

import torch

from training.configuration_sdar import preset_config
from training.diffusion import (TokenizedSample, autoregressive_loss, block_diffusion_loss, build_attention_mask,
                                noise_sample, pack_segments)
from training.modeling_sdar import SDARForCausalLM

H200_BF16_DENSE_PEAK = 989e12  # FLOP/s, NVIDIA's H200 SXM dense bf16 figure


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="0.6B")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--prompt-fraction", type=float, nargs="+", default=[0.0, 0.35])
    parser.add_argument("--ar-rows", type=int, default=8, help="AR batch: rows of --length tokens")
    # One long row: segments (2048 clean + 0..2048 noisy tokens) pack with little waste only when a row holds many.
    parser.add_argument("--bd-rows", type=int, default=1, help="block-diffusion batch: rows of --bd-row-length")
    parser.add_argument("--bd-row-length", type=int, default=32768)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=["ar", "bd_full", "bd_packed"])
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--device", default="cuda", help="cpu only for a dry run (dense attention, tiny preset)")
    args = parser.parse_args()

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    attention_backend = "flex" if on_gpu else "dense"
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    torch.manual_seed(0)
    config = preset_config(args.preset, block_size=args.block_size)
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

        def bd_step_factory(drop_unscored_blocks: bool):
            pending: list = []  # noised segments that did not fit the last batch

            def bd_step() -> int:
                # Enough fresh samples that the rows fill up; the rest waits (already noised) for the next step.
                capacity = args.bd_rows * args.bd_row_length
                while sum(s.length for s in pending) < 1.5 * capacity:
                    for sample in synthetic_samples(4, args.length, prompt_fraction, config.vocab_size, generator):
                        pending.append(noise_sample(sample, args.block_size, generator, drop_unscored_blocks))
                batch, leftover = pack_segments(pending, config.mask_token_id, args.block_size, args.bd_row_length,
                                                max_rows=args.bd_rows)
                pending[:] = leftover
                batch = batch.to(device)
                train_on(lambda: block_diffusion_loss(model, batch, build_attention_mask(batch, attention_backend)))
                return batch.num_clean_tokens

            return bd_step

        steps = {"ar": ar_step, "bd_full": bd_step_factory(False), "bd_packed": bd_step_factory(True)}
        baseline = None
        for variant in args.variants:
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            try:
                seconds, tokens = measure(steps[variant], args.warmup, args.steps, device)
            except Exception as error:  # report and go on: one failing variant must not hide the others
                print(f"{variant:10s} prompt {prompt_fraction:.2f}: FAILED {type(error).__name__}: {error}")
                continue
            tokens_per_second = tokens / seconds
            baseline = tokens_per_second if variant == "ar" else baseline
            row = dict(variant=variant, prompt_fraction=prompt_fraction, clean_tokens_per_s=round(tokens_per_second),
                       ratio_vs_ar=round(tokens_per_second / baseline, 3) if baseline else None,
                       mfu_ar_equivalent=round(tokens_per_second * flops_per_token / H200_BF16_DENSE_PEAK, 3),
                       step_ms=round(1000 * seconds / args.steps, 1),
                       peak_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if on_gpu else None)
            results.append(row)
            print(f"{variant:10s} prompt {prompt_fraction:.2f}: {row['clean_tokens_per_s']:>8} clean tok/s  "
                  f"ratio vs AR {row['ratio_vs_ar']}  MFU(AR-equiv) {row['mfu_ar_equivalent']:.1%}  "
                  f"{row['step_ms']} ms/step  {row['peak_memory_gib']} GiB  "
                  f"(compiled graphs so far: {torch._dynamo.utils.counters['stats']['unique_graphs']})", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           device=device_name, torch=torch.__version__, args=vars(args),
                           results=results), handle, indent=2)


if __name__ == "__main__":
    main()
