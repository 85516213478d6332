"""`dice verify REFERENCE.py CANDIDATE.py [--json]`: judge one candidate `ModelNew` against its KernelBench-format
reference. Prints a one-line summary (or the verdict as JSON). Without a GPU it still runs the static checks and,
where nvcc is installed, the compile (1-3 minutes a candidate on a 2-core machine), and says what it could not run;
exit code 0 only for `correct` (and `not_executed`). A candidate saved as a model's markdown answer is judged by
its fenced code block, with a note on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dice_pipeline.cli import summary


def register(subparsers) -> None:
    parser = subparsers.add_parser("verify", help="judge a candidate CUDA kernel against its PyTorch reference",
                                   description=summary(__doc__))
    parser.add_argument("reference", type=Path, help="KernelBench-format reference (class Model, get_inputs, ...)")
    parser.add_argument("candidate", type=Path, help="candidate file defining class ModelNew")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--no-execute", action="store_true", help="static checks and compile only, even with a GPU")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials (default 5)")
    parser.add_argument("--timing-samples", type=int, default=100)
    parser.add_argument("--tolerance-policy", choices=["v0.1", "current"], default="v0.1",
                        help="v0.1: atol=rtol=1e-2 (DICE); current: 1e-4 for fp32 (KernelBench main)")
    parser.add_argument("--build-profile", choices=["fast", "default"], default="fast")
    parser.add_argument("--cache-dir", default=None, help="build cache (default $DICE_VERIFY_CACHE or ~/.cache/...)")
    parser.add_argument("--device", type=int, action="append", default=None, help="GPU index (repeatable)")
    parser.add_argument("--baseline", action="append", default=[], choices=["cuda_graph", "compile"],
                        help="also time the reference as a CUDA graph or torch.compile'd and report the candidate's "
                             "speedup over it (repeatable; the status still rests on the eager comparison)")
    parser.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from dice_pipeline.prompts import unwrap_code_answer
    from dice_pipeline.verify import Status, VerifyConfig, verify_candidate

    for path in (args.reference, args.candidate):
        if not path.is_file():
            print(f"dice verify: no such file: {path}", file=sys.stderr)
            return 2
    overrides = {"build_cache_dir": args.cache_dir} if args.cache_dir else {}
    config = VerifyConfig(correctness_trials=args.trials, timing_samples=args.timing_samples,
                          tolerance_policy=args.tolerance_policy, build_profile=args.build_profile,
                          devices=args.device, execute=False if args.no_execute else None,
                          extra_baselines=tuple(args.baseline), **overrides)
    candidate, dropped = unwrap_code_answer(args.candidate.read_text())
    if dropped is not None:
        print(f"dice verify: {args.candidate} is a markdown answer: judging its fenced code block ({dropped} "
              f"characters around it dropped)", file=sys.stderr)
    verdict = verify_candidate(args.reference.read_text(), candidate, config)
    if args.json:
        print(verdict.to_json())
    else:
        print(verdict.summary())
        if verdict.status == Status.NOT_EXECUTED:
            print("not run here: " + "; ".join(r.message for r in verdict.reasons), file=sys.stderr)
    return 0 if verdict.status in (Status.CORRECT, Status.NOT_EXECUTED) else 1
