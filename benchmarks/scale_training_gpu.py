"""Training at the paper's scale, measured on one GPU: randomly initialised models of the real SDAR-4B shape (36
layers, hidden 2560, MLP 9728, 32/8 heads, untied head, vocabulary 151,936) and the 1.7B shape (Qwen3-1.7B: 28
layers, hidden 2048, MLP 6144, 16/8 heads), each trained for a few steps by the project's own SFT loop
(training/sft.py) sharded with FSDP2 on one rank, bf16 mixed precision, fused AdamW, with and without activation
checkpointing: clean tokens/s, MFU, peak memory. Autoregressive training of the same shape under the same settings
is the baseline (the issue's goals: block-diffusion SFT at MFU >= 30 % and >= 0.65x autoregressive tokens/s).
Then rollout decoding at the 4B shape (bf16, block 4, 4 steps, dynamic unmasking, KV cache sized for the paper's
4,096 new tokens, batch 16 and 64): tokens/s, and the rollout share of one RL step of the paper's recipe (64 tasks x
16 samples x up to 4,096 tokens) projected from it.

One command, time-boxed (--budget-s): measurements run most important first (4B training, 4B decoding, 1.7B
training); one that would start with less than --min-phase-s left is recorded as skipped, one that runs out of
memory as `oom` with the memory it reached. OUT/scale_training.json is rewritten after every measurement, so a run
cut short keeps what it measured.

    python benchmarks/scale_training_gpu.py --out OUT_DIR                 # H100/H200: ~15 min, at most 25
    python benchmarks/scale_training_gpu.py --out OUT_DIR --dry-run       # CPU, tiny shape, about a minute

Definitions. Block-diffusion rows are packed `[x_t ; x_0]` segments (noisy blocks without a masked token dropped),
`--bd-rows` rows of `--bd-row-length` tokens a step; autoregressive steps are `--ar-rows` rows of `--length` tokens
(about the same tokens a step). Samples are random tokens of `--length`, the first `--prompt-fraction` a prompt.
`mfu`: the FLOPs of what the model computes (6 x body parameters x tokens in the rows, 6 x hidden x vocabulary x
scored positions for the head, attention as block-causal within each copy: 12 x layers x heads x head_dim x visible
keys) over the step time and the GPU's dense bf16 peak; activation-checkpointing recompute is not counted (it is
overhead, not model FLOPs). `mfu_ar_equivalent`: clean tokens/s x an autoregressive token's FLOPs (the figure of
benchmarks/train_throughput.py). Decoding a random model commits one token a forward per row (nothing is confident):
tokens/s is the worst case of dynamic decoding, forwards/s the engine's speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU image runs the checkout, not an install

import torch  # noqa: E402

from training.configuration_sdar import SDARConfig, preset_config  # noqa: E402
from training.diffusion import TokenizedSample, autoregressive_loss  # noqa: E402
from training.distributed import Processes  # noqa: E402
from training.generate import block_diffusion_generate  # noqa: E402
from training.modeling_sdar import SDARForCausalLM  # noqa: E402
from training.parallel import ParallelSettings, autocast, clip_gradients, prepare_model  # noqa: E402
from training.sft import SFTConfig, block_diffusion_batches, train_block_diffusion  # noqa: E402

# The shapes measured. "4B" is SDAR-4B-Chat's config.json (untied head, unlike Qwen3-4B); "1.7B" Qwen3-1.7B's, the
# shape of SDAR-1.7B; "tiny" is for the CPU dry run.
SHAPES: dict[str, tuple[str, dict]] = {
    "4B": ("4B", dict(tie_word_embeddings=False, vocab_size=151936)),
    "1.7B": ("1.7B", dict(vocab_size=151936)),
    "tiny": ("tiny", dict(vocab_size=512)),
}
# Dense bf16 tensor-core peak (FLOP/s) by device name (NVIDIA's datasheets, SXM parts unless named).
PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "A100": 312e12}
RL_STEP_SEQUENCES, RL_STEP_NEW_TOKENS = 64 * 16, 4096  # the paper's recipe: 64 tasks x 16 samples, <= 4096 tokens


def shape_config(name: str) -> SDARConfig:
    preset, overrides = SHAPES[name]
    return preset_config(preset, **overrides)


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def synthetic_samples(count: int, length: int, prompt_fraction: float, config, seed: int) -> list[TokenizedSample]:
    """Random-token samples (the cost depends on the layout, not on the token values), none of them the mask."""
    generator = torch.Generator().manual_seed(seed)
    answer = torch.arange(length) >= int(round(prompt_fraction * length))
    high = min(config.vocab_size, config.mask_token_id)
    return [TokenizedSample(torch.randint(10, high, (length,), generator=generator), answer.clone())
            for _ in range(count)]


def body_parameters(config) -> int:
    """Matmul parameters of the decoder layers (what every token passes through)."""
    attn, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = config.hidden_size * (2 * attn + 2 * kv) + 3 * config.hidden_size * config.intermediate_size
    return config.num_hidden_layers * per_layer


def attention_flops(config, visible_keys: float) -> float:
    """Training FLOPs of attention (forward + backward: QK^T and AV, 2 FLOPs a multiply-add, x3) summed over queries."""
    return 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * visible_keys


def ar_flops_per_token(config, length: int) -> float:
    return 6 * body_parameters(config) + 6 * config.hidden_size * config.vocab_size + attention_flops(
        config, (length + 1) / 2)


def block_diffusion_step_flops(batch, config) -> float:
    """FLOPs of one packed block-diffusion batch: body over every real token, head over the scored ones, attention
    block-causal within each copy of each segment (a token sees about as many keys as its position)."""
    real = batch.segment_ids >= 0
    tokens = int(real.sum())
    keys = float((batch.position_ids.float() + 1)[real].sum())  # block-causal: ~position + 1 keys a token
    return (6 * body_parameters(config) * tokens + 6 * config.hidden_size * config.vocab_size
            * batch.scored_index.numel() + attention_flops(config, keys))


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _memory_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def _new_model(config, device):
    torch.manual_seed(0)
    with device:  # initialised where it trains: billions of parameters initialised on a CPU take minutes
        return SDARForCausalLM(config)


def measure_block_diffusion(shape: str, checkpointing: bool, args, device, peak, row_length: int) -> dict:
    """A few steps of the SFT loop itself (train_block_diffusion: FSDP on one rank, bf16, fused AdamW, flex
    attention on the GPU) on fixed rows of packed samples, `row_length` tokens a row."""
    config = shape_config(shape)
    steps = args.warmup + args.steps
    sft = SFTConfig(parallelism="fsdp", activation_checkpointing=checkpointing, mixed_precision=args.mixed_precision,
                    rows_per_step=args.bd_rows, row_length=row_length, epochs=1, max_steps=steps,
                    learning_rate=1e-5, warmup_steps=1, save_every=None, block_size=config.block_size)
    # Enough samples for every step: a sample of L tokens fills at least L and at most 2L of a row.
    count = math.ceil((steps + 1) * args.bd_rows * row_length / args.length) + 4
    samples = synthetic_samples(count, args.length, args.prompt_fraction, config, seed=1)
    batches = block_diffusion_batches(samples, sft, config.block_size, config.mask_token_id)
    flops = [block_diffusion_step_flops(batch, config) for _, (_, batch, _) in zip(range(steps), batches)]
    model = _new_model(config, device)
    run = train_block_diffusion(model, samples, sft)
    timed = run["history"][args.warmup:]
    seconds = timed[-1]["seconds"] - run["history"][args.warmup - 1]["seconds"]
    clean = sum(r["clean_tokens"] for r in timed)
    row = dict(row_length=row_length, tokens_per_s=round(clean / seconds), step_s=round(seconds / len(timed), 3),
               model_tflops_per_step=round(sum(flops[args.warmup:]) / len(timed) / 1e12, 2),
               loss_last=round(timed[-1]["loss"], 4), strategy=run["strategy"])
    if peak:
        row.update(mfu=round(sum(flops[args.warmup:]) / seconds / peak, 3),
                   mfu_ar_equivalent=round(clean / seconds * ar_flops_per_token(config, args.length) / peak, 3))
    del model, run
    return row


def measure_autoregressive(shape: str, checkpointing: bool, args, device, peak, processes, rows_per_step: int) -> dict:
    """The baseline: next-token training of the same shape, same sharding, precision and optimizer, answer tokens
    scored (as SFT scores them), `rows_per_step` rows of --length tokens a step."""
    config = shape_config(shape)
    model = _new_model(config, device)
    settings = ParallelSettings(parallelism="fsdp", activation_checkpointing=checkpointing,
                                mixed_precision=args.mixed_precision)
    prepare_model(model, settings, processes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    samples = synthetic_samples(rows_per_step * (args.warmup + args.steps), args.length, args.prompt_fraction,
                                config, seed=2)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    started = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            synchronize()
            started = time.perf_counter()
        rows = samples[step * rows_per_step:(step + 1) * rows_per_step]
        ids = torch.stack([s.input_ids for s in rows]).to(device)
        answer = torch.stack([s.answer_mask for s in rows]).to(device)
        with autocast(device, args.mixed_precision):
            loss = autoregressive_loss(model, ids, answer)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(model, 1.0)
        optimizer.step()
    last_loss = loss.item()  # waits for the last step
    seconds = time.perf_counter() - started
    tokens = args.steps * rows_per_step * args.length
    row = dict(rows=rows_per_step, tokens_per_s=round(tokens / seconds), step_s=round(seconds / args.steps, 3), loss_last=round(last_loss,
                                                                                                           4))
    if peak:
        row["mfu"] = round(tokens / seconds * ar_flops_per_token(config, args.length) / peak, 3)
    del model, optimizer
    return row


class _Enough(Exception):
    """Raised from the decoder's progress callback once the timed window is over."""


def measure_decoding(shape: str, batch: int, args, device) -> dict:
    """Block decoding of `batch` random prompts with a KV cache sized for the paper's answer length; timed after
    `--decode-warmup-forwards` forwards (CUDA-graph capture) for `--decode-seconds`."""
    config = shape_config(shape)
    model = _new_model(config, device).to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    prompts = [s.input_ids.tolist() for s in synthetic_samples(batch, args.prompt_tokens, 1.0, config, seed=3)]
    clock = dict(forwards=0, tokens=0, started=None)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def progress(committed: int) -> None:  # the decoder has synchronised (it read `committed` from the device)
        clock["forwards"] += 1
        if clock["forwards"] == args.decode_warmup_forwards:
            clock["started"] = time.perf_counter()
        elif clock["started"] is not None:
            clock["tokens"] += committed
            if time.perf_counter() - clock["started"] >= args.decode_seconds:
                raise _Enough

    try:
        block_diffusion_generate(model, prompts, args.decode_new_tokens, steps=config.block_size,
                                 strategy="dynamic", temperature=1.0, eos_token_id=None, pad_token_id=0,
                                 generator=torch.Generator(device=device).manual_seed(0), progress=progress)
    except _Enough:
        pass
    synchronize()
    if clock["started"] is None:
        raise RuntimeError("decoding finished before the timed window began: raise --decode-new-tokens")
    seconds = time.perf_counter() - clock["started"]
    forwards = clock["forwards"] - args.decode_warmup_forwards
    tokens_per_s = clock["tokens"] / seconds
    cache_tokens = args.prompt_tokens + args.decode_new_tokens
    row = dict(batch=batch, tokens_per_s=round(tokens_per_s, 1), forwards_per_s=round(forwards / seconds, 2),
               ms_per_forward=round(1000 * seconds / max(forwards, 1), 2), prompt_tokens=args.prompt_tokens,
               cache_positions=cache_tokens,
               kv_cache_gib=round(batch * cache_tokens * config.num_hidden_layers * 2 * config.num_key_value_heads
                                  * config.head_dim * 2 / 2**30, 2),
               # One RL step's rollouts (64 x 16 answers of up to 4,096 tokens) on one GPU at this rate, and on 8.
               rl_step_rollout_s_1gpu=round(RL_STEP_SEQUENCES * RL_STEP_NEW_TOKENS / tokens_per_s),
               rl_step_rollout_s_8gpu=round(RL_STEP_SEQUENCES * RL_STEP_NEW_TOKENS / tokens_per_s / 8))
    del model
    return row


def measure_training(kind: str, params: dict, args, device, peak, processes) -> dict:
    """A training measurement at the configured tokens a step; out of memory, again at half of them (down to one
    sample a step), each attempt recorded: the 4B shape's full fp32 + AdamW state alone is 70.6 GB, so what fits
    beside it on an 80 GB card is itself a finding."""
    size = args.bd_row_length if kind == "block_diffusion_sft" else args.ar_rows
    smallest = 2 * args.length if kind == "block_diffusion_sft" else 1
    attempts = []
    while True:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            if kind == "block_diffusion_sft":
                row = measure_block_diffusion(params["shape"], params["activation_checkpointing"], args, device,
                                              peak, size)
            else:
                row = measure_autoregressive(params["shape"], params["activation_checkpointing"], args, device, peak,
                                             processes, size)
            return dict(status="ok", oom_attempts=attempts, **row)
        except torch.OutOfMemoryError:
            attempts.append(dict(size=size, peak_memory_gib=_memory_gib()))
        _release()  # outside the except block: the traceback no longer holds the step's tensors
        if size // 2 < smallest:
            raise torch.OutOfMemoryError(f"out of memory down to {size} ({'row tokens' if smallest > 1 else 'rows'})")
        size //= 2


def plan(args) -> list[tuple[str, dict]]:
    """(kind, parameters) in the order they run: the 4B shape's training, its decoding, then the 1.7B shape."""
    phases = []
    for shape in args.shapes:
        for checkpointing in (True, False):
            phases += [("block_diffusion_sft", dict(shape=shape, activation_checkpointing=checkpointing)),
                       ("autoregressive", dict(shape=shape, activation_checkpointing=checkpointing))]
        if shape == args.decode_shape:
            phases += [("rollout_decoding", dict(shape=shape, batch=b)) for b in args.decode_batches]
    return phases


def ratios(results: list[dict]) -> list[dict]:
    """Block-diffusion against autoregressive tokens/s, per shape and checkpointing setting measured both ways."""
    found = {(r["kind"], r["shape"], r.get("activation_checkpointing")): r for r in results if r["status"] == "ok"}
    out = []
    for (kind, shape, checkpointing), row in found.items():
        ar = found.get(("autoregressive", shape, checkpointing))
        if kind == "block_diffusion_sft" and ar:
            out.append(dict(shape=shape, activation_checkpointing=checkpointing,
                            bd_over_ar_tokens_per_s=round(row["tokens_per_s"] / ar["tokens_per_s"], 3)))
    return out


def write(out: Path, args, device_name: str, results: list[dict], started: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale_training.json").write_text(json.dumps(dict(
        when=datetime.now(timezone.utc).isoformat(timespec="seconds"), device=device_name, torch=torch.__version__,
        args={k: v for k, v in vars(args).items() if k != "out"}, wall_s=round(time.perf_counter() - started, 1),
        results=results, bd_over_ar=ratios(results)), indent=2))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for scale_training.json")
    parser.add_argument("--budget-s", type=float, default=1500.0, help="wall-clock box for the whole run")
    parser.add_argument("--min-phase-s", type=float, default=90.0,
                        help="a measurement starts only with at least this much of the budget left")
    parser.add_argument("--shapes", nargs="+", default=["4B", "1.7B"], choices=sorted(SHAPES))
    parser.add_argument("--length", type=int, default=2048, help="tokens a sample (prompt + answer)")
    parser.add_argument("--prompt-fraction", type=float, default=0.35)
    parser.add_argument("--bd-rows", type=int, default=1)
    # About 7-8k clean tokens a step both ways (a 2048-token sample with a 35 % prompt packs into ~3.4k row tokens).
    # Sized for the 4B shape on one GPU, where fp32 weights, gradients and AdamW moments take 70.6 GB (halved on
    # out-of-memory: see measure_training).
    parser.add_argument("--bd-row-length", type=int, default=12288,
                        help="packed block-diffusion row (a sample of L tokens takes up to 2L)")
    parser.add_argument("--ar-rows", type=int, default=4, help="autoregressive rows of --length a step")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (flex attention compiles in the first)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps")
    parser.add_argument("--mixed-precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--decode-shape", default="4B", choices=sorted(SHAPES))
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-new-tokens", type=int, default=RL_STEP_NEW_TOKENS,
                        help="the KV cache is sized for this many new tokens (the paper's rollouts: 4096)")
    parser.add_argument("--decode-warmup-forwards", type=int, default=12)
    parser.add_argument("--decode-seconds", type=float, default=30.0, help="timed decoding window a batch size")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak, if the GPU is not known")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, the tiny shape, short everything: checks the script end to end")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.shapes, args.decode_shape, args.length, args.bd_row_length, args.ar_rows = ["tiny"], "tiny", 64, 512, 2
        args.warmup, args.steps, args.decode_batches, args.prompt_tokens = 1, 2, [2, 4], 16
        args.decode_new_tokens, args.decode_seconds, args.decode_warmup_forwards = 64, 1.0, 2
        args.min_phase_s = min(args.min_phase_s, 5.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run on the GPU host, or --dry-run for the CPU check")
    processes = Processes.join(one_process_group=True)  # FSDP shards over a group, even of one rank
    device = processes.device()
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = peak_flops(device, args.peak_tflops)
    if args.dry_run:
        peak = peak or 1e12  # nominal: exercises the MFU arithmetic
    print(f"{device_name} | torch {torch.__version__} | peak {peak and peak / 1e12} TFLOP/s | "
          f"budget {args.budget_s:.0f} s", flush=True)
    results: list[dict] = []
    for kind, params in plan(args):
        record = dict(kind=kind, **params)
        left = args.budget_s - (time.perf_counter() - started)
        if left < args.min_phase_s:
            results.append(dict(record, status="skipped", reason=f"{left:.0f} s of the budget left"))
            write(out, args, device_name, results, started)
            continue
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        try:
            if kind == "rollout_decoding":
                record.update(status="ok", **measure_decoding(params["shape"], params["batch"], args, device))
            else:
                record.update(measure_training(kind, params, args, device, peak, processes))
        except torch.OutOfMemoryError as error:
            record.update(status="oom", message=str(error).splitlines()[0][:300])
        except Exception as error:  # noqa: BLE001 - record it and go on: one failure must not hide the rest
            record.update(status="failed", message=f"{type(error).__name__}: {error}"[:500])
        record.update(peak_memory_gib=_memory_gib(), wall_s=round(time.perf_counter() - began, 1))
        results.append(record)
        _release()
        write(out, args, device_name, results, started)
        print(json.dumps(record), flush=True)
    write(out, args, device_name, results, started)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
