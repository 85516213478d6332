"""The GPU judgement of one candidate, run inside an isolated worker: correctness trials, runtime anti-gaming
checks and interleaved timing. Imports torch and the standard library only. The flow is `flow.CandidateJudge`;
each stage's machinery is a module of its own: inputs (the input draws), compare (output comparison, null outputs),
guard (the runtime guard), profile (the kernel profile), timing (the timed pairs), baselines (faster baselines).

Runtime policy (reason codes; NOTES.md section 3):
- `output_mismatch`, `shape_mismatch`, `dtype_mismatch`, `device_mismatch`, `output_structure_mismatch`,
  `output_not_plain_tensor` (incorrect): N seeded trials, candidate called before and after the reference on cloned
  inputs. A timed call's wrong output whose input is wrong again when called alone (and an input the trials saw is
  still right) is `output_mismatch` too: an input-dependent bug, its input's seed in the message.
- `output_not_fully_written` (incorrect): outputs are allocated from NaN-poisoned memory; poison left = unwritten.
- `no_better_than_null_output` (incorrect): on a degenerate task (zeros or a constant pass the tolerance), the
  output's relative error ||out - ref|| / ||ref|| is not well below the null output's (compare.NullOutputCheck).
- `mutated_inputs` (deceptive): an input changed by a candidate call (correctness or timed).
- `stale_output_reuse` (deceptive): a wrong output that equals the reference's result for an earlier call's inputs
  (a memoising cache keyed by pointer, shape or call count).
- `runtime_monkeypatch`, `global_flag_flip`, `spawned_thread` (deceptive): identities of torch/time callables,
  math flags and the thread count are compared with a snapshot taken before the candidate was imported.
- `dispatcher_override` (deceptive): PyTorch's operators given the candidate's kernels (`torch.library` impls or
  `TORCH_LIBRARY_IMPL(aten, ...)` on existing operators, backend fallbacks) or op calls re-routed (Python modes left
  on the stacks, autocast, dispatch keys included/excluded): they change the reference and the output checks too.
- `no_custom_kernel_ran` (deceptive): a profiler pass saw none of the candidate's own kernels; the custom share of
  GPU time is recorded (flag `minor_custom_kernel_share` under config.minor_custom_share).
- `baseline_kernel` (deceptive under config.baseline_kernel_policy "reject", else a flag): the candidate's own
  kernels did a minor share of its GPU time and PyTorch/library compute kernels the rest.
- `nondeterministic_output` (incorrect): two runs of the candidate on the same inputs disagree far beyond rounding.
- `infrastructure_error`: the verifier's own state ran out of GPU memory (`harness_out_of_memory`,
  `reference_out_of_memory`); `candidate_out_of_memory` is the candidate's runtime error. Both are judged once
  more with less resident state (config.low_memory) before the verdict stands.
- `generated_kernels_ran` (deceptive): that profiler pass saw kernels a compiler generated from PyTorch code
  (Inductor's Triton kernels, nvFuser): torch.compile reached some way the static checks could not read.
- `timed_output_mismatch` (deceptive): every timed call runs on fresh input values and its output is re-checked; a
  wrong one is judged again alone, and is deceptive where it is right alone, or where the candidate's answers
  changed since the correctness trials (its answer depends on more than its input's values).
- timing: every pair is timed in both conventions (`speedup_gpu`: flush and call enqueued back to back;
  `speedup_host`: device synchronized before the call); `speedup` is config.speedup_convention's.
- `work_outside_timed_stream` (deceptive): wall clock to a device-wide sync far exceeds the timed stream's events.
- flags: `degenerate_task` (zeros or a constant pass the task), `null_output_check_inconclusive` (on such a task no
  relative test can tell a kernel from a null output at this precision), `overhead_dominated` (the reference takes
  under config.overhead_floor_multiple launch floors: never rewarded), `nondeterministic_reference`.
"""

from dice_pipeline.verify.judge.compare import Comparison, compare_outputs
from dice_pipeline.verify.judge.flow import CandidateJudge
from dice_pipeline.verify.judge.guard import DispatcherSnapshot, RuntimeGuard
from dice_pipeline.verify.judge.judgement import Judgement, Rejection
from dice_pipeline.verify.judge.tensors import output_bytes

__all__ = ["CandidateJudge", "Comparison", "DispatcherSnapshot", "Judgement", "Rejection", "RuntimeGuard",
           "compare_outputs", "output_bytes"]
