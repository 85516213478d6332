"""A timed call's wrong output: an input-dependent bug (`incorrect`, its input's seed in the message) or behaviour
that depends on being timed (`deceptive / timed_output_mismatch`)? The judge calls the candidate alone on that input
(twice, in two copies) and on an input the correctness trials saw (judge.timing.TimingStage._judge_timed_mismatch).
CPU judge with the real timing loop (wall-clock events)."""

from __future__ import annotations

import re

import torch
from cpu_judge import timing_judge

from dice_pipeline.verify.verdict import Status

# Wrong wherever the input's first element is above 0.9: the correctness trials' draws (seeds 42-46) are not, some
# of the timing's fresh draws are. Like `roundf` against torch.round: a bug a few inputs show.
WRONG_FOR_SOME_INPUTS = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = x * 2.0
        if float(x[0, 0]) > 0.9:
            out = out + 1.0
        return out
"""

# Wrong whenever it is handed the very tensor of its previous call: the timed calls reuse their input buffer, the
# correctness trials and a call alone hand it a new copy. Right alone, wrong when timed.
WRONG_ON_A_REUSED_BUFFER = """
import weakref
import torch
class ModelNew(torch.nn.Module):
    last = None
    def forward(self, x):
        seen = ModelNew.last is not None and ModelNew.last() is x
        ModelNew.last = weakref.ref(x)
        return x * 2.0 + (1.0 if seen else 0.0)
"""

# Honest for its first calls (the correctness trials), wrong from then on whatever it is given.
WRONG_AFTER_THE_TRIALS = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        ModelNew.calls += 1
        return x * 2.0 + (1.0 if ModelNew.calls > 12 else 0.0)
"""

# After the trials, a different wrong answer on every call for the same values (what a cache keyed by an address or
# a call count returns).
DEPENDS_ON_THE_CALL = """
import torch
class ModelNew(torch.nn.Module):
    calls = 0
    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls <= 12:
            return x * 2.0
        return x * 2.0 + 1.0 + ModelNew.calls % 2
"""


def test_an_input_dependent_bug_is_incorrect_with_the_inputs_seed():
    judgement = timing_judge(WRONG_FOR_SOME_INPUTS, timing_samples=40, timing_max_samples=40).run()
    assert judgement.status == Status.INCORRECT, judgement.reasons
    reason = judgement.reasons[-1]
    assert reason.code == "output_mismatch" and "input-dependent bug" in reason.message
    seed = int(re.search(r"get_inputs\(\) draw seeded (\d+)", reason.message).group(1))
    torch.manual_seed(seed)  # the message's seed reproduces the failing input
    assert float(torch.rand(64, 32)[0, 0]) > 0.9
    assert judgement.fields["provenance"]["input_dependent_failure"]["input"].endswith(str(seed))


def test_a_candidate_wrong_only_when_timed_is_deceptive():
    judgement = timing_judge(WRONG_ON_A_REUSED_BUFFER).run()
    assert judgement.status == Status.DECEPTIVE, judgement.reasons
    assert judgement.reasons[-1].code == "timed_output_mismatch"
    assert "called alone on the same input it is right" in judgement.reasons[-1].message


def test_a_candidate_whose_answers_changed_after_the_trials_is_deceptive_not_input_dependent():
    judgement = timing_judge(WRONG_AFTER_THE_TRIALS).run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[-1].code == "timed_output_mismatch"
    assert "right during the trials" in judgement.reasons[-1].message


def test_a_candidate_answering_the_same_values_differently_call_by_call_is_deceptive():
    judgement = timing_judge(DEPENDS_ON_THE_CALL).run()
    assert judgement.status == Status.DECEPTIVE and judgement.reasons[-1].code == "timed_output_mismatch"
    assert "answered differently" in judgement.reasons[-1].message


def test_an_honest_candidate_is_never_rerun():
    judge = timing_judge()
    reruns = []
    judge._judge_timed_mismatch = lambda *args: reruns.append(args)
    assert judge.run().status == Status.CORRECT and not reruns
