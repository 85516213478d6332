"""Rewards for RL on kernel generation: a batch of (task, completion, extracted candidate) requests in, one outcome per
request out. `VerifierReward` is DICE's binary execution reward (1 iff the verifier says `correct`: it compiles and
matches the reference), judging every request of a step in ONE `verify_batch` call (isolated workers, builds in
parallel). `StaticCheckReward` is the honest reward for hosts without a GPU: the verifier's static checks only.

Standard library only (plus dice_pipeline.verify and dice_pipeline.prompts, which are standard library only in this
process: torch runs only inside the verifier's workers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dice_pipeline.prompts import extract_code_block
from dice_pipeline.verify import VerifyConfig, VerifyJob, verify_batch
from training.tasks import RLTask

INFRASTRUCTURE_ERROR = "infrastructure_error"  # == dice_pipeline.verify.verdict.Status.INFRASTRUCTURE_ERROR (0.3)
NO_CODE = "no_code"  # the completion holds no code block to judge
MINOR_CUSTOM_SHARE = "minor_custom_kernel_share"
BASELINE_KERNEL = "baseline_kernel"


@dataclass
class RewardRequest:
    """One rollout to judge: its task, the decoded completion, and the candidate file extracted from it (None when
    the completion holds no code)."""

    task: RLTask
    completion_text: str
    candidate_src: str | None


@dataclass
class RewardOutcome:
    """The judgement of one rollout. `status` is the verifier's status string (or `no_code`, or
    `infrastructure_error` when the judge failed rather than the candidate: such a rollout gets no reward and is left
    out of its group's statistics). `deceptive` marks reward hacking, with `reason_codes` saying how."""

    reward: float
    status: str
    reason_codes: list[str] = field(default_factory=list)
    deceptive: bool = False
    error: str | None = None
    message: str = ""

    @property
    def excluded(self) -> bool:
        """True when the judge failed (not the candidate): the rollout takes no part in its group's advantages."""
        return self.status == INFRASTRUCTURE_ERROR


RewardFn = Callable[[list[RewardRequest]], list[RewardOutcome]]


def infrastructure_failure(error: str) -> RewardOutcome:
    return RewardOutcome(reward=0.0, status=INFRASTRUCTURE_ERROR, error=error,
                         message=f"the reward could not be computed: {error}")


def _join_lines(*parts: str) -> str:
    """Concatenate file pieces, adding a newline only where neither side of a seam has one (the infilling split
    cuts at line boundaries, so an exact concatenation stays exact)."""
    text = ""
    for part in parts:
        if text and part and not text.endswith("\n") and not part.startswith("\n"):
            text += "\n"
        text += part
    return text


def candidate_source(task: RLTask, completion_text: str) -> str | None:
    """The file to judge. End-to-end: the completion's code block (`extract_code_block`). Infilling (the task has a
    prefix or suffix): prefix + middle + suffix, the middle being the completion's code block if it wrote one (any
    fence), else the completion itself. None when there is nothing to judge."""
    if task.prefix is None and task.suffix is None:
        return extract_code_block(completion_text)
    middle = extract_code_block(completion_text)
    if middle is None:
        fenced = completion_text.strip()
        if fenced.startswith("```"):  # a fence in another language (cuda, cpp): take its body
            body = fenced.split("\n", 1)[1] if "\n" in fenced else ""
            middle = body.rsplit("```", 1)[0] if "```" in body else body
        else:
            middle = completion_text
    if not middle.strip():
        return None
    return _join_lines(task.prefix or "", middle, task.suffix or "")


class VerifierReward:
    """DICE's reward: 1.0 iff the verifier's status is one of `reward_statuses` (default `correct`), else 0.0.

    All requests of a call go to ONE `verify_batch` call. Candidates with no code get 0 (`no_code`) without a worker.
    The judge failing is never the candidate's fault: an `infrastructure_error` verdict, a verifier that raises, or a
    batch still unfinished after `batch_timeout_s` cost only the rollouts concerned their reward (recorded as
    `infrastructure_error`). Until the verifier's `baseline_kernel` policy exists (verifier 0.3), a verdict flagged
    `minor_custom_kernel_share` (the candidate's own kernels do a minor share of the GPU time) is treated as deceptive:
    reward 0, reason `minor_custom_kernel_share`; after, a verdict flagged `baseline_kernel` (policy "report") is."""

    description = "execution reward: 1 iff the kernel compiles and passes the verifier's correctness check"

    def __init__(self, config: VerifyConfig | None = None, reward_statuses: Sequence[str] = ("correct",),
                 batch_timeout_s: float | None = None,
                 verify: Callable[..., list] = verify_batch):
        self.config = config or VerifyConfig()
        self.reward_statuses = frozenset(reward_statuses)
        self.batch_timeout_s = batch_timeout_s
        self.verify = verify
        # Verifier 0.3 judges baseline kernels itself (`baseline_kernel_policy`); before it, we reject the flag here.
        self.reject_minor_custom_share = "baseline_kernel_policy" not in VerifyConfig.__dataclass_fields__

    def __call__(self, requests: list[RewardRequest]) -> list[RewardOutcome]:
        outcomes: list[RewardOutcome | None] = [None] * len(requests)
        jobs, job_index = [], []
        for index, request in enumerate(requests):
            if request.candidate_src is None:
                outcomes[index] = RewardOutcome(0.0, NO_CODE, [NO_CODE], message="the completion holds no code block")
                continue
            jobs.append(VerifyJob(f"{request.task.task_id}#{index}", request.task.reference_src,
                                  request.candidate_src))
            job_index.append(index)
        for index, verdict in zip(job_index, self._verify(jobs)):
            outcomes[index] = verdict if isinstance(verdict, RewardOutcome) else self.outcome(verdict)
        return [o for o in outcomes if o is not None]

    def prepare(self, requests: list[RewardRequest]) -> None:
        """Build these candidates now (static checks and compiles into the verifier's build cache; nothing
        executes), while the policy is still sampling: the reward call that judges them later finds their builds
        cached. Only an optimisation: a failure here changes no verdict, so it is ignored."""
        if self.config.execute is False and not self.config.build_without_gpu:
            return  # the judging call will build nothing either
        jobs = [VerifyJob(f"{r.task.task_id}#prepare{i}", r.task.reference_src, r.candidate_src)
                for i, r in enumerate(requests) if r.candidate_src is not None]
        if jobs:
            try:
                self.verify(jobs, replace(self.config, execute=False, build_without_gpu=True, verdict_store_dir=None))
            except Exception:  # noqa: BLE001 - see docstring
                pass

    def _verify(self, jobs: list[VerifyJob]) -> list:
        """Verdicts in job order; a verifier failure or timeout becomes infrastructure_error outcomes."""
        if not jobs:
            return []
        finished: dict[str, object] = {}
        failure: list[str] = []

        def collect(job, verdict) -> None:
            finished[job.job_id] = verdict

        def run() -> None:
            try:
                for job, verdict in zip(jobs, self.verify(jobs, self.config, on_result=collect)):
                    finished[job.job_id] = verdict
            except Exception as exc:  # noqa: BLE001 - the judge failed, not the candidates
                failure.append(f"{type(exc).__name__}: {exc}")

        if self.batch_timeout_s is None:
            run()
        else:  # the verifier's own stage limits bound each worker; this bounds the whole call
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(self.batch_timeout_s)
            if thread.is_alive():
                failure.append(f"reward batch unfinished after {self.batch_timeout_s:g} s")
        reason = failure[0] if failure else "the verifier returned no verdict"
        return [finished.get(job.job_id) or infrastructure_failure(reason) for job in jobs]

    def outcome(self, verdict) -> RewardOutcome:
        status = getattr(verdict.status, "value", verdict.status)
        codes = list(verdict.reason_codes())
        message = "; ".join(r.message for r in verdict.reasons)[:500]
        if status == INFRASTRUCTURE_ERROR:
            return RewardOutcome(0.0, status, codes, error=message or "verifier infrastructure error", message=message)
        deceptive = status == "deceptive"
        if status in self.reward_statuses:
            # A reward for PyTorch doing the work is what RL learns to hack: a baseline kernel is never rewarded,
            # even under a verifier config that only flags it (baseline_kernel_policy "report").
            if BASELINE_KERNEL in verdict.flags:
                return RewardOutcome(0.0, "deceptive", codes + [BASELINE_KERNEL], deceptive=True,
                                     message="flagged baseline_kernel: PyTorch ops do most of the GPU work")
            if self.reject_minor_custom_share and MINOR_CUSTOM_SHARE in verdict.flags:
                return RewardOutcome(0.0, "deceptive", codes + [MINOR_CUSTOM_SHARE], deceptive=True,
                                     message="the candidate's own kernels do a minor share of the GPU time "
                                             "(rejected until the verifier's baseline_kernel policy lands)")
        return RewardOutcome(1.0 if status in self.reward_statuses else 0.0, status, codes, deceptive, message=message)


class StaticCheckReward(VerifierReward):
    """The reward for hosts without a GPU, stated as such: 1.0 iff the candidate parses and passes the verifier's
    static checks (AST: the anti-gaming rules that need no execution), else 0.0. Nothing is executed and (unless
    `build=True`, which also compiles it: minutes a candidate on a small CPU) nothing is built; every outcome's
    message says so. A real, weaker signal than correctness: it rewards well-formed honest-looking kernels."""

    description = "static checks only: nothing executed (1 iff the candidate parses and passes the static checks)"

    def __init__(self, config: VerifyConfig | None = None, build: bool = False, batch_timeout_s: float | None = None,
                 verify: Callable[..., list] = verify_batch):
        config = replace(config or VerifyConfig(), execute=False, build_without_gpu=build, verdict_store_dir=None)
        super().__init__(config, reward_statuses=("not_executed",), batch_timeout_s=batch_timeout_s, verify=verify)
        self.build = build

    def outcome(self, verdict) -> RewardOutcome:
        outcome = super().outcome(verdict)
        what = "static checks and build only" if self.build else "static checks only"
        outcome.message = f"{what}: nothing executed. {outcome.message}".strip()
        return outcome
