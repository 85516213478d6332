"""Training with the model sharded over ranks (FSDP2) on CPU with gloo: the strategy a config picks; SFT on two ranks
under torchrun follows the one-process loss curve, writes sharded state beside a whole from_pretrained export, and a
run killed mid-way resumes to the uninterrupted run's weights; the RL update on two sharded ranks (uneven work: the
idle rank pairs the busy rank's collectives) equals one process's, a sharded RL run matches the replicated one and
resumes exactly.

Tolerances: sharded and one-process curves agree to rel 1e-5 (the reduce-scatter sums in another order; measured
~4e-8); a resumed sharded run equals the uninterrupted one to 1e-7 (same world size, same reduction order)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dice_pipeline.prompts import format_kernel_response, kernel_generation_messages
from training import SDARForCausalLM, preset_config
from training.checkpoints import SHARDED_STATE, resolve_checkpoint
from training.data import write_jsonl
from training.generate import block_diffusion_generate
from training.parallel import FSDP_AUTO_PARAMETERS, choose_strategy, compute_dtype
from training.rewards import RewardOutcome
from training.rl import RLConfig, ppo_update, train_rl
from training.sft import SFTConfig, run_sft_stage
from training.tasks import RLTask
from training.tokenizer import train_bpe_tokenizer
from training.trace import rollouts_from_generation

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ["import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
            "__global__ void k(float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 0.f; }\n"]


def test_the_strategy_is_the_configs_and_auto_shards_only_big_models_on_several_ranks():
    assert choose_strategy("auto", 10_000, world=1) == "single"
    assert choose_strategy("auto", 10_000, world=2) == "ddp"
    assert choose_strategy("auto", FSDP_AUTO_PARAMETERS, world=2) == "fsdp"
    assert choose_strategy("auto", FSDP_AUTO_PARAMETERS, world=1) == "single"
    assert choose_strategy("fsdp", 10_000, world=1) == "fsdp"  # one rank sharded: the single-GPU measurement
    assert choose_strategy("ddp", FSDP_AUTO_PARAMETERS, world=4) == "ddp"
    assert compute_dtype("auto", torch.device("cpu")) == torch.float32
    assert compute_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ValueError, match="parallelism"):
        SFTConfig(parallelism="zero2")
    with pytest.raises(ValueError, match="mixed_precision"):
        RLConfig(mixed_precision="fp8")


# ----------------------------------------------------------------------------------------------------------- SFT
SFT = dict(epochs=3, samples_per_step=2, learning_rate=1e-3, save_every=2, tokenizer_vocab_size=1024)
SHARDED = dict(SFT, parallelism="fsdp", activation_checkpointing=True)


@pytest.fixture
def sft_data(tmp_path, pair_factory):
    rows = [{"prompt_messages": json.dumps(kernel_generation_messages(pair_factory(i)["pytorch_code"])),
             "response": format_kernel_response(pair_factory(i)["generated_code"])} for i in range(5)]
    return write_jsonl(rows, tmp_path / "sft.jsonl")


def _torchrun_sft(data, out, config, results, nproc=2):
    """`torchrun --nproc_per_node N -m training.stages sft ...`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
               "-m", "training.stages", "sft", "--base", "preset:tiny", "--data", str(data), "--out", str(out),
               "--config", json.dumps(config), "--no-progress", "--results", str(results)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process, timeout=300):
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-3000:]


def _losses(path):
    return [record["loss"] for record in json.loads(Path(path).read_text())["history"]]


@pytest.mark.slow
def test_sharded_sft_on_two_ranks_follows_one_process_and_a_killed_run_resumes_exactly(tmp_path, sft_data):
    single = run_sft_stage("preset:tiny", sft_data, tmp_path / "single", SFTConfig(**SFT), resume=False)
    assert single["strategy"] == "single" and single["step"] == 9

    _finish(_torchrun_sft(sft_data, tmp_path / "sharded", SHARDED, tmp_path / "sharded.json"))
    sharded = json.loads((tmp_path / "sharded.json").read_text())
    assert sharded["strategy"] == "fsdp" and sharded["world_size"] == 2 and sharded["step"] == 9
    assert _losses(tmp_path / "sharded.json") == pytest.approx([r["loss"] for r in single["history"]], rel=1e-5)
    assert sharded["tokens_seen"] == single["tokens_seen"]

    # The step directory: shards of model + optimizer from every rank, and the whole model as one export that
    # from_pretrained loads; its weights are the one-process run's.
    step_dir = Path(sharded["checkpoint"])
    assert (step_dir / SHARDED_STATE / ".metadata").is_file() and not (step_dir / "optimizer.pt").exists()
    assert len(list((step_dir / SHARDED_STATE).glob("*.distcp"))) == 2
    exported = SDARForCausalLM.from_pretrained(step_dir)
    assert type(exported) is SDARForCausalLM and json.loads((step_dir / "config.json").read_text())[
        "architectures"] == ["SDARForCausalLM"]
    reference = load_file(Path(single["checkpoint"]) / "model.safetensors")
    assert set(load_file(step_dir / "model.safetensors")) == set(reference)  # the tied head written once
    for name, value in reference.items():  # AdamW's early steps amplify rounding: compare by relative norm
        assert (exported.state_dict()[name] - value).norm() <= 1e-4 * value.norm(), name

    # Stopped after its first checkpoint (SIGTERM to torchrun, which kills its ranks: what cancelling a run does),
    # then rerun: it resumes from the sharded state.
    out = tmp_path / "killed"
    process = _torchrun_sft(sft_data, out, SHARDED, tmp_path / "unused.json")
    deadline = time.monotonic() + 120
    while not (out / "latest").is_file() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)
    saved = json.loads((resolve_checkpoint(out) / "trainer_state.json").read_text())
    assert 2 <= saved["step"] < 9, "killed before its first checkpoint or after the end: nothing to resume"
    _finish(_torchrun_sft(sft_data, out, SHARDED, tmp_path / "resumed.json"))
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["resumed_from"] == saved["step"] and resumed["step"] == 9
    assert _losses(tmp_path / "resumed.json") == pytest.approx(_losses(tmp_path / "sharded.json"), abs=1e-7)
    final, uninterrupted = load_file(Path(resumed["checkpoint"]) / "model.safetensors"), load_file(
        step_dir / "model.safetensors")
    assert all(torch.allclose(final[k], uninterrupted[k], rtol=0, atol=1e-7) for k in final)


# ------------------------------------------------------------------------------------------------------------ RL
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 33)), [40, 41, 42, 43]]


def _tokenizer():
    return train_bpe_tokenizer(SNIPPETS * 4, vocab_size=300, min_frequency=1)


def _model(tokenizer, seed=0):
    """Untied head, as SDAR-4B/8B (the SFT test's preset ties it): embedding and head shard as units of their own."""
    torch.manual_seed(seed)
    config = preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                           tie_word_embeddings=False)
    return SDARForCausalLM(config).eval()


def _rollouts(model):
    result = block_diffusion_generate(model, PROMPTS, 10, temperature=1.0, generator=torch.Generator().manual_seed(4))
    rollouts = rollouts_from_generation(result, PROMPTS, 4, [(0, row) for row in range(len(PROMPTS))])
    rollouts[1].length, rollouts[2].length = 5, 7
    return rollouts, [1.0, -1.0, 0.5, -0.5]


def _tasks():
    return [RLTask(task_id=f"t{i}", messages=[{"role": "user", "content": f"Write kernel {i}."}],
                   reference_src="", difficulty=d) for i, d in enumerate([1, 0, 2])]


def _first_in_group(requests):
    """A deterministic reward that varies within a task: 1 for its alphabetically first completion."""
    best = {}
    for r in requests:
        best[r.task.task_id] = min(best.get(r.task.task_id, r.completion_text), r.completion_text)
    return [RewardOutcome(float(r.completion_text == best[r.task.task_id]), "correct") for r in requests]


RL = dict(tasks_per_step=3, samples_per_task=2, max_new_tokens=8, learning_rate=1e-3, checkpoint_every=1,
          micro_batch_size=1, minibatches=2, ppo_epochs=1, seed=5)


def _sharded_rl_worker(rank: int, workdir: str) -> None:
    """One of two gloo ranks: the sharded update on fixed rollouts split unevenly, then replicated and sharded RL
    runs, and a sharded run stopped after step 1 and resumed."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                                         world_size=2)
    try:
        from torch.distributed.fsdp import FSDPModule

        from training.distributed import Processes
        from training.parallel import ParallelSettings, prepare_model

        tokenizer = _tokenizer()
        model = _model(tokenizer)
        rollouts, advantages = _rollouts(model)
        assert prepare_model(model, ParallelSettings(parallelism="fsdp"), Processes()) == "fsdp"
        assert all(isinstance(m, FSDPModule) for m in (model, model.lm_head, model.model.embed_tokens))
        # Rank 0 replays three rollouts (a forward per denoising step each), rank 1 one: rank 1 runs fillers.
        mine = [0, 1, 2] if rank == 0 else [3]
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # linear in the gradient: comparable to rounding
        update = ppo_update(model, optimizer, [rollouts[i] for i in mine], [advantages[i] for i in mine],
                            RLConfig(ppo_epochs=1, minibatches=1, micro_batch_size=1), step=1)
        from training.parallel import full_state_dict

        after_update = full_state_dict(model)
        runs = {}
        for name, settings, steps, out in (("replicated", dict(parallelism="ddp"), 2, "ddp"),
                                           ("sharded", dict(parallelism="fsdp", activation_checkpointing=True), 2,
                                            "fsdp"),
                                           ("cut", dict(parallelism="fsdp"), 1, "cut"),
                                           ("resumed", dict(parallelism="fsdp"), 2, "cut")):
            # The resumed run starts from other weights: everything must come from the sharded checkpoint.
            runs[name] = train_rl(_model(tokenizer, seed=99 if name == "resumed" else 0), tokenizer, _tasks(),
                                  _first_in_group, RLConfig(**RL, steps=steps, **settings), f"{workdir}/{out}")
        with open(f"{workdir}/rank{rank}.pkl", "wb") as handle:
            pickle.dump(dict(update=update, after_update=after_update, runs=runs), handle)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_sharded_rl_updates_like_one_process_matches_the_replicated_run_and_resumes_exactly(tmp_path):
    torch.multiprocessing.spawn(_sharded_rl_worker, args=(str(tmp_path),), nprocs=2, join=True)
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]

    tokenizer = _tokenizer()
    model = _model(tokenizer)
    rollouts, advantages = _rollouts(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    single = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rollouts, advantages,
                        RLConfig(ppo_epochs=1, minibatches=1, micro_batch_size=1), step=1)
    assert max((model.state_dict()[k] - v).abs().max().item() for k, v in before.items()) > 1e-4
    assert ranks[0]["update"]["loss"] == pytest.approx(single["loss"], abs=1e-6)
    assert ranks[0]["update"]["tokens_trained"] == single["tokens_trained"] == 10 + 5 + 7 + 10
    for name, value in ranks[0]["after_update"].items():
        assert torch.allclose(value, model.state_dict()[name], atol=1e-6), name

    runs = ranks[0]["runs"]
    replicated, sharded = runs["replicated"], runs["sharded"]
    assert [r["strategy"] for r in sharded] == ["fsdp", "fsdp"] and [r["strategy"] for r in replicated] == ["ddp"] * 2
    for a, b in zip(sharded, replicated):
        assert a["task_ids"] == b["task_ids"] and a["tokens_generated"] == b["tokens_generated"]
        assert a["reward_mean"] == b["reward_mean"] and a["groups_used"] == b["groups_used"]
        for key in ("loss", "kl", "clip_fraction"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    assert all(r["update"] == "applied" for r in sharded)
    # Stopped after step 1 and rerun: step 2 is the uninterrupted run's step 2.
    resumed = runs["resumed"]
    assert [r["step"] for r in resumed] == [1, 2]
    for key in ("task_ids", "tokens_generated", "reward_mean", "groups_used", "loss", "kl", "clip_fraction"):
        got, want = resumed[1][key], sharded[1][key]
        assert got == (want if isinstance(want, (str, list, dict)) or want is None
                       else pytest.approx(want, abs=1e-7)), key
    # Every rank returns the same history.
    for a, b in zip(runs["sharded"], ranks[1]["runs"]["sharded"]):
        assert {k: v for k, v in a.items() if not k.startswith(("seconds", "wall"))} == \
               {k: v for k, v in b.items() if not k.startswith(("seconds", "wall"))}
    assert (tmp_path / "cut" / "step-2" / SHARDED_STATE / ".metadata").is_file()
