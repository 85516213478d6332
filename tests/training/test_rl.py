"""TraceRL on CPU with a tiny model: advantage arithmetic, the clipped objective and k3 KL by hand, the trace replay
against the sampler's own distributions and against step-by-step recomputation, the easy->hard schedule, a killed
and resumed run, reward failures costing one rollout, the verifier reward's static-only path, and two gloo ranks
training as one process does."""

from __future__ import annotations

import math
import time

import pytest
import torch

import training.generate as generate_module
from dice_pipeline.verify import Status, Verdict, VerifyConfig
from tests.dice_pipeline.verify.verify_cases import HONEST, REFERENCE, STATIC_CASES
from tests.training.conftest import CODE_SNIPPETS
from training import SDARForCausalLM, preset_config
from training.diffusion import TokenizedSample, noise_sample, pack_segments
from training.generate import block_diffusion_generate, model_logits
from training.rewards import (INFRASTRUCTURE_ERROR, RewardOutcome, RewardRequest, StaticCheckReward,
                              VerifierReward, candidate_source)
from training.rl import RLConfig, group_advantages, ppo_update, score_completions, trace_rl_token_loss, train_rl
from training.tasks import RLTask, order_easy_to_hard, schedule, task_order_fingerprint, tasks_for_step
from training.tokenizer import train_bpe_tokenizer
from training.trace import rollouts_from_generation, trace_batches, trace_log_probs

# --------------------------------------------------------------------------------------------------- advantages


def test_advantages_are_z_scores_within_a_group_and_flat_groups_are_dropped():
    groups = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, None, 1.0, 1.0], [None, 1.0], [0.0, 0.0]]
    result = group_advantages(groups)
    # mean 0.5, population std 0.5 -> +-1
    assert result[0] == [1.0, -1.0, -1.0, 1.0]
    assert result[1] is None  # all equal: no signal
    # [0, 1, 1] without the failed rollout: mean 2/3, std sqrt(2)/3 -> -sqrt(2), 1/sqrt(2), 1/sqrt(2)
    assert result[2][1] is None
    assert result[2][0] == pytest.approx(-math.sqrt(2)) and result[2][2] == pytest.approx(1 / math.sqrt(2))
    assert result[2][3] == pytest.approx(1 / math.sqrt(2))
    assert result[3] is None and result[4] is None  # one judged rollout; all zero


# --------------------------------------------------------------------------------------------------------- loss


def test_trace_rl_token_loss_matches_the_hand_computed_clipped_objective_and_k3():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.4]))
    new = torch.log(torch.tensor([0.75, 0.3, 0.5, 0.44]))  # ratios 1.5, 0.6, 1.0, 1.1
    advantages = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss, k3, clipped = trace_rl_token_loss(new, old, advantages, clip=0.2, kl_coef=0.1)
    # min(r A, clip(r) A): 1.5 -> min(1.5, 1.2) = 1.2; 0.6, A=-1 -> min(-0.6, -0.8) = -0.8; 1.0 -> -1; 1.1 -> 2.2
    surrogate = torch.tensor([1.2, -0.8, -1.0, 2.2])
    # k3 = 1/r - 1 + log r
    ratios = torch.tensor([1.5, 0.6, 1.0, 1.1])
    expected_k3 = 1 / ratios - 1 + torch.log(ratios)
    assert torch.allclose(k3, expected_k3, atol=1e-6)
    assert expected_k3[0] == pytest.approx(1 / 1.5 - 1 + math.log(1.5))
    assert torch.allclose(loss, -surrogate + 0.1 * expected_k3, atol=1e-6)
    assert clipped.tolist() == [True, True, False, False]
    # d(-r A)/d logp = -r A where min() picks the unclipped term; 0 where the clipped (constant) term wins.


# ------------------------------------------------------------------------------------------------- trace replay


def _rollouts_from_generation(result, prompts, block_size):
    return rollouts_from_generation(result, prompts, block_size, [(0, row) for row in range(len(prompts))])


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 33)), [40, 41, 42, 43]]  # lengths 3, 2, 1, 0 mod 4


@pytest.mark.parametrize("strategy,steps,threshold", [("static", 4, 0.9), ("dynamic", 4, 0.004),
                                                      ("static", 2, 0.9), ("dynamic", 3, 0.004)])
def test_trace_replay_gives_the_samplers_own_log_probs(any_tiny_model, monkeypatch, strategy, steps, threshold):
    """Record the distribution the sampler drew each committed token from; the replay must give the same log-prob,
    for prompts of every length modulo the block size, decoded together, under both prediction shifts."""
    model = any_tiny_model
    recorded = []
    real_sample_tokens = generate_module.sample_tokens

    def recording_sample_tokens(logits, temperature=0.0, *args, **kwargs):
        recorded.append(torch.log_softmax(logits.float() / temperature, dim=-1).clone())
        return real_sample_tokens(logits, temperature, *args, **kwargs)

    monkeypatch.setattr(generate_module, "sample_tokens", recording_sample_tokens)
    config = RLConfig(block_size=4, denoising_steps=steps, temperature=1.0, micro_batch_size=2)
    generator = torch.Generator().manual_seed(3)
    result = block_diffusion_generate(model, PROMPTS, 10, steps=steps, strategy=strategy,
                                      confidence_threshold=threshold,
                                      temperature=1.0, generator=generator)
    # An EOS in the middle of a block: the tokens after it stay in that block's states, out of the response.
    eos = int(result.tokens[1, 5])
    recorded.clear()
    result = block_diffusion_generate(model, PROMPTS, 10, steps=steps, strategy=strategy,
                                      confidence_threshold=threshold,
                                      temperature=1.0, eos_token_id=eos, generator=torch.Generator().manual_seed(3))
    assert int(result.lengths[1]) <= 6
    rollouts = _rollouts_from_generation(result, PROMPTS, 4)
    replayed = trace_log_probs(model, rollouts, config)

    first_forward = int(result.block_unmask_steps[result.block_unmask_steps >= 0].min())
    expected = []
    for row, rollout in enumerate(rollouts):
        for j in range(rollout.length):
            forward = int(rollout.block_steps[j])
            offset = (len(rollout.prompt_ids) + j) % 4  # the token's place in its block: SDAR's partition
            expected.append(recorded[forward - first_forward][row, offset, int(rollout.block_tokens[j])])
    assert replayed.shape == (sum(r.length for r in rollouts),)
    assert torch.allclose(replayed, torch.stack(expected), atol=1e-4)


def test_trace_replay_equals_recomputing_each_denoising_step_with_model_logits(any_tiny_model):
    model = any_tiny_model
    shift = model.config.prediction_shift
    config = RLConfig(block_size=4, denoising_steps=4, temperature=0.7, micro_batch_size=3)
    result = block_diffusion_generate(model, PROMPTS, 9, steps=4, strategy="dynamic", confidence_threshold=0.004,
                                      temperature=0.7, generator=torch.Generator().manual_seed(1))
    rollouts = _rollouts_from_generation(result, PROMPTS, 4)
    replayed = trace_log_probs(model, rollouts, config)

    mask = model.config.mask_token_id
    expected = []
    for rollout in rollouts:
        length = len(rollout.prompt_ids)
        sequence = torch.cat((torch.tensor(rollout.prompt_ids), rollout.block_tokens))
        steps = torch.cat((torch.full((length,), -1), rollout.block_steps))
        for block in range(length // 4, (length + rollout.length - 1) // 4 + 1):
            span = slice(block * 4, block * 4 + 4)
            tokens, forwards = sequence[span], steps[span]
            given = torch.arange(block * 4, block * 4 + 4) < length
            state_log_probs = {}
            for forward in sorted(set(forwards[~given].tolist())):  # one uncached forward per denoising step
                state = torch.where(given | (forwards < forward), tokens, mask)
                ids = torch.cat((sequence[:block * 4], state))
                predicting = (torch.arange(block * 4, block * 4 + 4) - shift).clamp(min=0)  # 0 is always given
                with torch.no_grad():
                    logits = model_logits(model, ids[None], 0, ids.numel(), 4, None)[0, predicting].float()
                logits[:, mask] = float("-inf")
                state_log_probs[forward] = torch.log_softmax(logits / 0.7, dim=-1)
            for j in range(4):
                if length <= block * 4 + j < length + rollout.length:
                    expected.append(state_log_probs[int(forwards[j])][j, int(tokens[j])])
    assert torch.allclose(replayed, torch.stack(expected), atol=1e-4)


def test_the_replay_uses_the_training_partition_for_prompts_of_every_length(tiny_model):
    prompts = [list(range(50, 50 + length)) for length in range(4, 12)]
    result = block_diffusion_generate(tiny_model, prompts, 7, strategy="static", steps=1)
    rollouts = _rollouts_from_generation(result, prompts, 4)
    (trace,) = list(trace_batches(rollouts, 4, 1, tiny_model.config.mask_token_id))
    for row, rollout in enumerate(rollouts):
        ids = torch.cat((torch.tensor(rollout.prompt_ids), rollout.block_tokens))
        sample = TokenizedSample(ids, torch.arange(ids.numel()) >= len(rollout.prompt_ids))
        segment = noise_sample(sample, 4, torch.Generator().manual_seed(0), drop_unscored_blocks=False)
        training = pack_segments([segment], 3, 4, 2 * ids.numel())[0]
        noisy = trace.batch.is_noisy[row] & (trace.batch.segment_ids[row] >= 0)
        positions = trace.batch.position_ids[row, noisy]
        assert torch.equal(trace.batch.block_ids[row, noisy], training.block_ids[0, positions])
        assert int(positions.min()) == len(rollout.prompt_ids) // 4 * 4  # the block holding the prompt's end


# ---------------------------------------------------------------------------------------------------- schedule


def _tasks(difficulties, prefix=None):
    return [RLTask(task_id=f"t{i}-{d}", messages=[{"role": "user", "content": f"Write kernel {i} (level {d})."}],
                   reference_src=REFERENCE, difficulty=d, prefix=prefix) for i, d in enumerate(difficulties)]


def test_schedule_walks_tasks_easy_to_hard_in_a_stable_order_and_wraps():
    tasks = _tasks([2, 0, 1, 0, "3", 1])
    ids = [[t.task_id for t in step] for step in schedule(tasks, steps=3, tasks_per_step=4)]
    assert ids == [["t1-0", "t3-0", "t2-1", "t5-1"], ["t0-2", "t4-3", "t1-0", "t3-0"],
                   ["t2-1", "t5-1", "t0-2", "t4-3"]]
    ordered = order_easy_to_hard(tasks)
    # The step index alone fixes a step's tasks: a restart at step 3 gets exactly what the whole walk gives.
    assert [t.task_id for t in tasks_for_step(ordered, 3, 4)] == ids[2]
    assert task_order_fingerprint(tasks) == task_order_fingerprint(list(reversed(tasks))[::-1])
    assert task_order_fingerprint(tasks) != task_order_fingerprint(tasks[:-1])
    with pytest.raises(ValueError, match="not a number"):
        order_easy_to_hard(_tasks(["hard"]))


# ------------------------------------------------------------------------------------------------------ training


def _parity_reward(requests):
    """A deterministic reward with variance: the parity of the completion's characters."""
    return [RewardOutcome(float(sum(map(ord, r.completion_text)) % 2), "correct") for r in requests]


def _first_in_group_reward(requests):
    """A deterministic reward that always varies within a task: 1 for the task's alphabetically first completion."""
    best = {}
    for r in requests:
        best[r.task.task_id] = min(best.get(r.task.task_id, r.completion_text), r.completion_text)
    return [RewardOutcome(float(r.completion_text == best[r.task.task_id]), "correct") for r in requests]


def _fresh_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = preset_config("tiny", vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
    return SDARForCausalLM(config).eval()


def _small_config(**overrides):
    values = dict(steps=2, tasks_per_step=2, samples_per_task=4, max_new_tokens=8, learning_rate=1e-3,
                  checkpoint_every=1, micro_batch_size=3, minibatches=2, ppo_epochs=2,
                  confidence_threshold=0.004, seed=5)
    values.update(overrides)
    return RLConfig(**values)


class Killed(Exception):
    pass


def test_a_killed_run_resumes_with_the_same_tasks_and_metrics_as_an_uninterrupted_one(small_tokenizer, tmp_path):
    tasks = _tasks([1, 0, 2, 1])
    config = _small_config()
    whole_model = _fresh_model(small_tokenizer)
    whole = train_rl(whole_model, small_tokenizer, tasks, _first_in_group_reward, config, tmp_path / "whole")
    assert [r["step"] for r in whole] == [1, 2]
    assert all(r["update"] == "applied" for r in whole)  # so the optimizer's state must survive the restart
    assert whole[1]["optimizer_steps"] == 4  # 2 epochs x 2 minibatches
    assert all(r["kl"] > 0 for r in whole)  # after the first optimizer step the policy leaves the rollout policy

    def kill_after_step_one(record):
        if record["step"] == 1:
            raise Killed

    with pytest.raises(Killed):
        train_rl(_fresh_model(small_tokenizer), small_tokenizer, tasks, _first_in_group_reward, config,
                 tmp_path / "cut", on_step=kill_after_step_one)
    assert (tmp_path / "cut" / "latest").read_text() == "step-1"
    steps_run = []
    # A differently initialised model: everything must come from the checkpoint.
    resumed_model = _fresh_model(small_tokenizer, seed=99)
    resumed = train_rl(resumed_model, small_tokenizer, tasks, _first_in_group_reward, config, tmp_path / "cut",
                       on_step=lambda r: steps_run.append(r["step"]))
    assert steps_run == [2]
    assert [r["task_ids"] for r in resumed] == [r["task_ids"] for r in whole]
    for key in ("reward_mean", "groups_used", "tokens_generated", "loss", "kl", "clip_fraction", "status_counts",
                "update"):
        for got, want in zip([r[key] for r in resumed], [r[key] for r in whole]):
            exact = want is None or isinstance(want, (str, dict))
            assert got == (want if exact else pytest.approx(want, rel=1e-5)), key
    for a, b in zip(whole_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)
    log = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(log) == 2
    # A different task list cannot resume into this run.
    with pytest.raises(ValueError, match="different schedule"):
        train_rl(_fresh_model(small_tokenizer), small_tokenizer, tasks[:3], _first_in_group_reward,
                 _small_config(steps=3), tmp_path / "cut")


def test_first_update_loss_is_minus_the_token_mean_advantage(tiny_model):
    """With one pass and one minibatch the ratio is 1 and k3 is 0: loss = -sum(A x tokens) / tokens."""
    result = block_diffusion_generate(tiny_model, PROMPTS[:3], 10, temperature=1.0,
                                      generator=torch.Generator().manual_seed(2))
    rollouts = _rollouts_from_generation(result, PROMPTS[:3], 4)
    rollouts[1].length = 5  # responses of different lengths weigh by their tokens
    advantages = [1.0, -1.0, 0.5]
    config = RLConfig(ppo_epochs=1, minibatches=1, micro_batch_size=2, learning_rate=1e-3)
    optimizer = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    before = [p.clone() for p in tiny_model.parameters()]
    record = ppo_update(tiny_model, optimizer, rollouts, advantages, config, step=1)
    assert record["loss"] == pytest.approx(-(10 * 1.0 - 5 * 1.0 + 10 * 0.5) / 25, abs=1e-6)
    assert record["kl"] == pytest.approx(0.0, abs=1e-7) and record["clip_fraction"] == 0.0
    assert record["tokens_trained"] == 25 and record["optimizer_steps"] == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))


def test_a_step_where_every_group_scores_the_same_updates_nothing_and_says_so(small_tokenizer, tmp_path):
    model = _fresh_model(small_tokenizer)
    before = [p.clone() for p in model.parameters()]
    record = train_rl(model, small_tokenizer, _tasks([0, 1]), StaticCheckReward(), _small_config(steps=1),
                      tmp_path)[0]
    # A random tiny model writes no code block: every rollout is judged no_code, 0 reward, every group dropped.
    assert record["status_counts"] == {"no_code": 8}
    assert record["groups_used"] == 0 and record["groups_dropped"] == 2 and record["loss"] is None
    assert record["update"].startswith("skipped")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_only_the_newest_checkpoints_are_kept(small_tokenizer, tmp_path):
    config = _small_config(steps=3, tasks_per_step=1, samples_per_task=2, max_new_tokens=4, keep_checkpoints=2)
    history = train_rl(_fresh_model(small_tokenizer), small_tokenizer, _tasks([0]), StaticCheckReward(), config,
                       tmp_path)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-2", "step-3"]
    assert (tmp_path / "latest").read_text() == "step-3" and history[-1]["checkpoint"] == str(tmp_path / "step-3")
    generated = [r["tokens_generated"] for r in history]
    assert [r["tokens_seen"] for r in history] == [sum(generated[:i + 1]) for i in range(3)]


def test_a_reward_failure_costs_only_that_rollout(small_tokenizer, tmp_path):
    calls = []

    def flaky_reward(requests):
        calls.append(len(requests))
        if any(r.completion_text == flaky_reward.bad for r in requests):
            raise RuntimeError("reward worker crashed")
        return _parity_reward(requests)

    def marking_reward(requests):
        outcomes = _parity_reward(requests)
        outcomes[0] = RewardOutcome(0.0, INFRASTRUCTURE_ERROR, error="lost worker")
        outcomes[5] = RewardOutcome(0.0, "deceptive", ["baseline_kernel"], deceptive=True)
        return outcomes

    config = _small_config(steps=1)
    probe = train_rl(_fresh_model(small_tokenizer), small_tokenizer, _tasks([0, 1]), marking_reward, config,
                     tmp_path / "marked")[0]
    assert probe["reward_excluded"] == 1 and probe["status_counts"][INFRASTRUCTURE_ERROR] == 1
    assert probe["deceptive"] == 1 and probe["deceptive_by_reason"] == {"baseline_kernel": 1}
    assert probe["deceptive_share"] == probe["deceptive_share_by_reason"]["baseline_kernel"] == 1 / 8
    assert probe["samples"] == 8

    # Find a completion to fail on (same seeds: the same completions come again).
    texts = []
    train_rl(_fresh_model(small_tokenizer), small_tokenizer, _tasks([0, 1]),
             lambda rs: texts.extend(r.completion_text for r in rs) or _parity_reward(rs), config, tmp_path / "probe")
    flaky_reward.bad = texts[2]
    record = train_rl(_fresh_model(small_tokenizer), small_tokenizer, _tasks([0, 1]), flaky_reward, config,
                      tmp_path / "flaky")[0]
    assert record["reward_excluded"] == texts.count(texts[2]) == record["status_counts"][INFRASTRUCTURE_ERROR]
    assert record["samples"] == 8 and calls[0] == 8 and calls[1:] == [1] * 8  # the batch, then one at a time


# ------------------------------------------------------------------------------------------------------ rewards


def _request(text, prefix=None, suffix=None):
    task = RLTask("relu2", [{"role": "user", "content": "x"}], REFERENCE, 0, prefix=prefix, suffix=suffix)
    return RewardRequest(task, text, candidate_source(task, text))


def test_static_check_reward_judges_real_candidates_with_the_verifiers_static_checks_only():
    deceptive = next(case for case in STATIC_CASES if case.name == "torch_only_forward")
    requests = [_request(f"Here it is:\n```python\n{HONEST}\n```"), _request(f"```python\n{deceptive.source}\n```"),
                _request("I cannot write that."), _request("```python\nclass ModelNew(:\n```")]
    started = time.perf_counter()
    outcomes = StaticCheckReward()(requests)
    assert time.perf_counter() - started < 30  # static only: no worker, no build
    assert [o.status for o in outcomes] == ["not_executed", "deceptive", "no_code", "compile_error"]
    assert [o.reward for o in outcomes] == [1.0, 0.0, 0.0, 0.0]
    assert outcomes[1].deceptive and "torch_only_forward" in outcomes[1].reason_codes
    assert outcomes[0].message.startswith("static checks only: nothing executed")
    # The execution reward gives nothing for a candidate nothing has executed.
    strict = VerifierReward(VerifyConfig(execute=False, build_without_gpu=False))(requests[:1])
    assert strict[0].status == "not_executed" and strict[0].reward == 0.0


def test_verifier_reward_rejects_a_minor_custom_kernel_share_and_survives_a_failing_verifier():
    def verify(jobs, config, on_result=None):
        return [Verdict(Status.CORRECT, flags=["minor_custom_kernel_share"]), Verdict(Status.CORRECT),
                Verdict(Status.INCORRECT), Verdict(Status.CORRECT, flags=["baseline_kernel"])]

    requests = [_request(f"```python\n{HONEST}\n```") for _ in range(4)]
    outcomes = VerifierReward(verify=verify)(requests)
    if VerifierReward().reject_minor_custom_share:  # until the verifier's baseline_kernel policy lands
        assert outcomes[0].reward == 0.0 and outcomes[0].deceptive
        assert outcomes[0].reason_codes == ["minor_custom_kernel_share"]
    else:  # verifier 0.3 judges baseline kernels itself; the flag alone is no reason
        assert outcomes[0].reward == 1.0 and not outcomes[0].deceptive
    assert [o.reward for o in outcomes[1:3]] == [1.0, 0.0]
    # Under baseline_kernel_policy "report" the verifier only flags a baseline kernel: still no reward.
    assert outcomes[3].reward == 0.0 and outcomes[3].deceptive and outcomes[3].reason_codes == ["baseline_kernel"]

    def broken(jobs, config, on_result=None):
        raise OSError("no space left for build workers")

    outcomes = VerifierReward(verify=broken)(requests)
    assert all(o.excluded and "no space left" in o.error for o in outcomes)

    def hangs(jobs, config, on_result=None):
        on_result(jobs[0], Verdict(Status.CORRECT))
        time.sleep(5)

    outcomes = VerifierReward(verify=hangs, batch_timeout_s=0.3)(requests)
    assert outcomes[0].reward == 1.0 and all(o.excluded for o in outcomes[1:])


def test_infilling_reward_judges_prefix_plus_generated_middle_plus_suffix():
    prefix, suffix = "import torch\n", "\nclass ModelNew:\n    pass\n"
    assert _request('source = """k"""', prefix, suffix).candidate_src == prefix + 'source = """k"""' + suffix
    fenced = _request('```cuda\nsource = """k"""\n```', prefix, suffix).candidate_src
    assert fenced == prefix + 'source = """k"""\n' + suffix
    assert _request("   ", prefix, suffix).candidate_src is None


def test_score_completions_sends_one_batched_call():
    calls = []
    outcomes = score_completions(lambda rs: calls.append(len(rs)) or _parity_reward(rs), _tasks([0, 1]),
                                 [(0, "a"), (1, "b"), (0, "c")])
    assert calls == [3] and [o.reward for o in outcomes] == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------- two processes


def _two_rank_worker(rank: int, workdir: str) -> None:
    """One of two gloo ranks: a data-parallel PPO update, then a short train_rl run."""
    import pickle

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                                         world_size=2)
    try:
        tokenizer = train_bpe_tokenizer(CODE_SNIPPETS * 4, vocab_size=400, min_frequency=1)
        model = _fresh_model(tokenizer)
        rollouts, advantages = _fixed_rollouts(model)
        config = RLConfig(ppo_epochs=1, minibatches=1, micro_batch_size=2, learning_rate=1e-3)
        # SGD: the step is linear in the averaged gradient, so the ranks' result matches the single process to
        # rounding. (AdamW's first step is lr * sign(grad) where a gradient is near 0: the all-reduce's other
        # summation order can flip such a sign and move that weight by 2 * lr, a flaky comparison.)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        update = ppo_update(model, optimizer, rollouts[rank::2], advantages[rank::2], config, step=1)
        after_update = {k: v.clone() for k, v in model.state_dict().items()}

        reward_calls = []

        def reward(requests):
            reward_calls.append(len(requests))
            return _first_in_group_reward(requests)

        history = train_rl(_fresh_model(tokenizer, seed=rank), tokenizer, _tasks([1, 0, 2]), reward,
                           _small_config(tasks_per_step=3, samples_per_task=2, minibatches=1, ppo_epochs=1),
                           f"{workdir}/run")
        with open(f"{workdir}/rank{rank}.pkl", "wb") as out:
            pickle.dump(dict(update=update, after_update=after_update, history=history, reward_calls=reward_calls),
                         out)
    finally:
        torch.distributed.destroy_process_group()


def _fixed_rollouts(model):
    prompts = PROMPTS[:3] + [[40, 41, 42, 43, 44]]
    result = block_diffusion_generate(model, prompts, 10, temperature=1.0, generator=torch.Generator().manual_seed(4))
    rollouts = _rollouts_from_generation(result, prompts, 4)
    rollouts[1].length, rollouts[2].length = 5, 7
    return rollouts, [1.0, -1.0, 0.5, -0.5]


def test_two_gloo_ranks_train_like_one_process(small_tokenizer, tmp_path):
    import pickle

    torch.multiprocessing.spawn(_two_rank_worker, args=(str(tmp_path),), nprocs=2, join=True)
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]

    # The data-parallel update (each rank half the rollouts) is the single-process update on all of them.
    model = _fresh_model(small_tokenizer)
    rollouts, advantages = _fixed_rollouts(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    single = ppo_update(model, torch.optim.SGD(model.parameters(), lr=1e-3), rollouts, advantages,
                        RLConfig(ppo_epochs=1, minibatches=1, micro_batch_size=2), step=1)
    # the step moves weights far beyond the comparison's tolerance (a rank that skipped the all-reduce would fail)
    assert max((model.state_dict()[k] - v).abs().max().item() for k, v in before.items()) > 1e-4
    for rank in ranks:
        assert rank["update"]["loss"] == pytest.approx(single["loss"], abs=1e-6)
        assert rank["update"]["tokens_trained"] == single["tokens_trained"] == 10 + 5 + 7 + 10
        for name, value in model.state_dict().items():
            assert torch.allclose(rank["after_update"][name], value, atol=1e-6), name

    # train_rl: rank 0 alone judges every rollout of a step in one call; both ranks end with the same history.
    assert ranks[0]["reward_calls"] == [6, 6] and ranks[1]["reward_calls"] == []
    first, second = ranks[0]["history"], ranks[1]["history"]
    assert [r["samples"] for r in first] == [6, 6] and [r["ranks"] for r in first] == [2, 2]
    for a, b in zip(first, second):
        assert {k: v for k, v in a.items() if not k.startswith(("seconds", "wall"))} == \
               {k: v for k, v in b.items() if not k.startswith(("seconds", "wall"))}
    assert (tmp_path / "run" / "latest").read_text() == "step-2"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["dense", "flex"])
def test_trace_replay_on_the_gpu_gives_the_cpu_log_probs(tiny_model, backend):
    result = block_diffusion_generate(tiny_model, PROMPTS, 9, strategy="dynamic",
                                      confidence_threshold=0.004, temperature=1.0,
                                      generator=torch.Generator().manual_seed(1))
    rollouts = _rollouts_from_generation(result, PROMPTS, 4)
    on_cpu = trace_log_probs(tiny_model, rollouts, RLConfig(micro_batch_size=2))
    on_gpu = trace_log_probs(tiny_model.cuda(), rollouts,  # bf16 autocast
                             RLConfig(micro_batch_size=2, attention_backend=backend)).cpu()
    assert torch.allclose(on_cpu, on_gpu, atol=5e-2)


def test_reward_builds_overlap_sampling_batch_by_batch_before_the_one_judging_call(small_tokenizer, tmp_path):
    events = []

    class PreparingReward:
        def prepare(self, requests):
            events.append(("prepare", len(requests)))

        def __call__(self, requests):
            events.append(("judge", len(requests)))
            return _first_in_group_reward(requests)

    config = _small_config(steps=1, rollout_batch_size=4)
    record = train_rl(_fresh_model(small_tokenizer), small_tokenizer, _tasks([0, 1]), PreparingReward(), config,
                      tmp_path)[0]
    assert events == [("prepare", 4), ("prepare", 4), ("judge", 8)]
    assert record["seconds_reward_prepare"] >= 0 and record["update"] == "applied"


def test_verifier_reward_prepare_builds_without_executing():
    configs = []

    def verify(jobs, config, on_result=None):
        configs.append((len(jobs), config))
        return []

    requests = [_request(f"```python\n{HONEST}\n```"), _request("no code here")]
    VerifierReward(verify=verify).prepare(requests)
    (count, config), = configs
    assert count == 1 and config.execute is False and config.build_without_gpu and config.verdict_store_dir is None
    StaticCheckReward(verify=verify).prepare(requests)  # static only: nothing to build ahead
    assert len(configs) == 1
