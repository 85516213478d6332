"""The timing of a judgement (TimingStage, mixed into CandidateJudge): interleaved reference/candidate pairs on
fresh inputs, L2 flushed, each pair timed in both conventions (`speedup_gpu`: flush and call enqueued back to back;
`speedup_host`: device synchronized before the call), in rounds until the median paired ratio is known to the
configured precision; every timed output re-checked, every input checked for writes, and wall clock to a
device-wide sync against the events (`work_outside_timed_stream`). Plus the statistics it rests on."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable

import torch

from dice_pipeline.verify.judge.compare import compare_outputs, consistency_tolerance, relative_error_of
from dice_pipeline.verify.judge.inputs import fresh_inputs_on_device
from dice_pipeline.verify.judge.judgement import CandidateFailed, Rejection
from dice_pipeline.verify.judge.tensors import clone, reject_mutated_inputs, shares_memory
from dice_pipeline.verify.verdict import Status, TimingStats

# Timed calls draw fresh inputs each call only when one draw takes less than this.
FRESH_DRAW_MAX_SECONDS = 0.02
# The warm-up ends when the median of the last WARMUP_WINDOW pairs' device time is within this share of the median
# of the WARMUP_WINDOW before (see warm_up).
WARMUP_WINDOW = 3
WARMUP_STEADY_TOLERANCE = 0.03


def timing_stats(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    mean = statistics.fmean(ordered)
    std = statistics.pstdev(ordered) if len(ordered) > 1 else 0.0
    return TimingStats(median_ms=statistics.median(ordered), iqr_ms=quartiles[2] - quartiles[0], mean_ms=mean,
                       n=len(ordered), cv=std / mean if mean > 0 else 0.0)


def warm_up(pair: Callable[[], float], min_seconds: float, max_seconds: float, clock: Callable[[], float],
            window: int = WARMUP_WINDOW, tolerance: float = WARMUP_STEADY_TOLERANCE) -> tuple[int, bool]:
    """Run `pair` (one untimed reference/candidate pair; returns its device time in ms) until the device is warm:
    at least min_seconds and 2 x `window` pairs, and the median of the last `window` pairs within `tolerance` of
    the median of the `window` before (clocks climbing from idle shorten every window until they stop); at most
    max_seconds (and never fewer than 3 pairs). A device kept busy by other work before the timed section is
    steady at once; one that sat idle warms for as long as its times keep falling. Returns (pairs, steady)."""
    times: list[float] = []
    started = clock()
    while True:
        times.append(pair())
        elapsed = clock() - started
        if len(times) >= 2 * window and elapsed >= min_seconds:
            last, before = statistics.median(times[-window:]), statistics.median(times[-2 * window:-window])
            if abs(last - before) <= tolerance * before:
                return len(times), True
        if len(times) >= 3 and elapsed >= max_seconds:
            return len(times), False


def median_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median: the order statistics n/2 -/+ z*sqrt(n)/2."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = z * math.sqrt(n) / 2
    low, high = max(0, math.floor(n / 2 - half_width)), min(n - 1, math.ceil(n / 2 + half_width) - 1)
    return ordered[low], ordered[high]


class TimingStage:
    """CandidateJudge's timed section (uses its models, inputs, config, guard, judgement, the GPU share and the
    harness-owned timer, events and device sync)."""

    def _output_right(self, reference: Any, output: Any) -> bool:
        """The check every timed output gets: allclose at the policy tolerance and, on a degenerate task, the
        relative error within the null-output bound (a null output passes allclose there)."""
        if not compare_outputs(reference, output, (self.policy_tolerance,), stats=False).passes[self.policy_tolerance]:
            return False
        return self.null_output_bound is None or relative_error_of(reference, output) <= self.null_output_bound

    def _wrong_by(self, reference: Any, output: Any) -> str:
        """How far a wrong output is off, for the message."""
        comparison = compare_outputs(reference, output, (self.policy_tolerance,))
        if comparison.problem is not None:
            return comparison.problem[1]
        return f"max abs diff {comparison.max_abs_diff:.3e}, relative error {comparison.relative_error:.3e}"

    def _judge_timed_mismatch(self, sample: int, pristine: list[Any], wrong_by: str, origin: str) -> None:
        """A timed call returned a wrong output: an input-dependent bug (`incorrect`) or behaviour that depends on
        being timed (`deceptive`)? The same input is given to the candidate alone, twice, in two live copies (other
        addresses than the timed buffer's), with the reference's answer made alone too, and then the first input of
        the correctness trials, which it answered right then:
        - right alone (either copy): wrong only when timed -> deceptive, timed_output_mismatch;
        - the two copies answered differently: its answer depends on more than the input's values (an address or
          a call count) -> deceptive, timed_output_mismatch;
        - the correctness trials' input now wrong too: its answers changed after the trials -> deceptive;
        - else wrong again alone, the same way, while the trials' input is still right: an input-dependent bug ->
          incorrect, output_mismatch, with the input's seed in the message. Always raises."""
        cfg = self.config
        seed = cfg.seed + 2000 + sample
        when = f"timed call {sample} returned a wrong result ({wrong_by}) on {origin}"
        reference = self._call_reference(pristine, seed)
        copies = (clone(pristine), clone(pristine))  # both alive: two addresses
        answers = [self._call_candidate(pristine, seed, "timing", given=given) for given in copies]
        del copies
        if any(self._output_right(reference, answer) for answer in answers):
            raise Rejection(Status.DECEPTIVE, "timed_output_mismatch",
                            f"{when}; called alone on the same input it is right: wrong only when timed (a cache or "
                            "phase-dependent behaviour)", "anti_gaming")
        tight = min(consistency_tolerance(d, self.policy_tolerance, cfg.consistency_tolerance_ratio)
                    for d in (compare_outputs(reference, answers[0], ()).dtype_names or ["float32"]))
        if not compare_outputs(answers[0], answers[1], (tight,), stats=False).passes[tight]:
            raise Rejection(Status.DECEPTIVE, "timed_output_mismatch",
                            f"{when}; called alone twice on the same input values (two copies) it answered "
                            "differently: its answer depends on more than its input (an address or a call count)",
                            "anti_gaming")
        control = self._inputs(cfg.seed)
        control_reference = self._call_reference(control, cfg.seed)
        if not self._output_right(control_reference, self._call_candidate(control, cfg.seed, "timing")):
            raise Rejection(Status.DECEPTIVE, "timed_output_mismatch",
                            f"{when}; alone it is wrong again, and so is its answer for the first correctness trial's "
                            f"input (seed {cfg.seed}), right during the trials: its behaviour changed after them",
                            "anti_gaming")
        self.judgement.provenance["input_dependent_failure"] = {"timed_call": sample, "input": origin}
        raise Rejection(Status.INCORRECT, "output_mismatch",
                        f"{when}; called alone on the same input it is wrong again, the same way, while the "
                        f"correctness trials' inputs are still right: an input-dependent bug (reproduce with "
                        f"{origin})", "timing")

    def _timed_gpu(self, fn: Callable[[], Any], flush: torch.Tensor, start: Any, end: Any) -> tuple[Any, float]:
        """GPU-time convention (KernelBench, triton do_bench): the flush and the call are enqueued back to back, so
        the GPU is busy flushing while the host launches and the events bracket GPU work, not launch latency."""
        flush.zero_()
        start.record()
        out = fn()
        end.record()
        self._synchronize()
        return out, start.elapsed_time(end)

    def _timed_host(self, fn: Callable[[], Any], flush: torch.Tensor, start: Any, end: Any) -> tuple[Any, float, float]:
        """Host-inclusive convention: the device is idle when the start event is recorded, so the interval also
        holds the host's launch latency of forward; plus wall clock to a device-wide sync (side-stream check)."""
        flush.zero_()
        self._synchronize()
        wall_start = self._perf_counter()
        start.record()
        out = fn()
        end.record()
        self._synchronize()  # device-wide: work left on any stream is waited for before the wall clock stops
        wall_ms = (self._perf_counter() - wall_start) * 1e3
        return out, start.elapsed_time(end), wall_ms

    def _launch_floors_ms(self, flush: torch.Tensor, start: Any, end: Any) -> dict[str, float]:
        """Median time of a one-element kernel in each convention: the floor under which times are overhead."""
        scalar = torch.zeros(1, device=self.device)
        gpu = [self._timed_gpu(lambda: scalar.add_(1), flush, start, end)[1] for _ in range(30)]
        host = [self._timed_host(lambda: scalar.add_(1), flush, start, end)[1] for _ in range(30)]
        return {"gpu": statistics.median(gpu), "host": statistics.median(host)}

    def run_timing(self, *, last_gpu_use: bool = False) -> None:
        """Interleaved reference/candidate pairs (order alternating, L2 flushed before each call) on fresh inputs,
        each pair timed in both conventions; a speedup is the median of its convention's per-pair ratios, so slow
        drifts (clocks, temperature) cancel. Samples come in rounds with freshly allocated input buffers until the
        configured convention's median is known to cfg.timing_target_precision (or the budget is spent).

        The set-up (the flush buffer, the input buffers' host draw, the device RNG's first draw) is untimed work, so
        it runs beside other lanes' untimed work (phase timing_setup); the rest has the GPU alone (phase timing)."""
        with self.phase("timing_setup"):
            setup = self._timing_setup()
        with self.alone("timing", last_gpu_use=last_gpu_use):
            self._run_timed_pairs(*setup)
        # Outside the section that has the GPU alone: the read is 0.06 s of CPU work the other lanes' timed
        # sections would wait for. Kernels the candidate gave PyTorch's operators at any point still hold now.
        self.guard.check("during the correctness trials and timing", thorough=True)

    def _timing_setup(self) -> tuple[torch.Tensor, list[Any], bool]:
        """(L2 flush buffer, input buffers, whether get_inputs() can draw on the device): the first device draw
        also warms up the device RNG."""
        cfg = self.config
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        buffers = self._inputs(cfg.seed + 1000)
        drawable = self._device_draw(buffers, -2) is not None
        self._synchronize()
        return flush, buffers, drawable

    def _device_draw(self, like: list[Any], sample: int) -> list[Any] | None:
        """The timing's fresh get_inputs() draw for `sample`, made on the device (fresh_inputs_on_device)."""
        return fresh_inputs_on_device(self.reference.get_inputs, like, self.device, self.config.seed + 2000 + sample)

    def _run_timed_pairs(self, flush: torch.Tensor, buffers: list[Any], drawable: bool) -> None:
        cfg, j = self.config, self.judgement
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def draw(sample: int) -> list[Any] | None:
            return self._device_draw(buffers, sample)

        # Per-call draws only where they are cheap (a get_inputs() doing real work on the host would slow every
        # sample down), measured with the GPU alone.
        draws_on_device = False
        if drawable:
            draw_started = self._perf_counter()
            draws_on_device = draw(-1) is not None
            self._synchronize()
            draws_on_device &= self._perf_counter() - draw_started < FRESH_DRAW_MAX_SECONDS
        input_sets = [] if draws_on_device else [
            self._inputs(cfg.seed + 1000 + k) for k in range(1 if cfg.low_memory else cfg.timing_input_sets)]

        def load_fresh_inputs(sample: int) -> list[Any] | None:
            # New values every call (addresses change only between rounds): defeats caches keyed by pointer, call
            # count or input checksum. Preferably a fresh get_inputs() draw made on the GPU (returned: a copy of
            # the values now in the buffers, never handed to a model); else one of the stored input sets with its
            # rows re-permuted (None).
            fresh = draw(sample) if draws_on_device else None
            if fresh is not None:
                for buf, src in zip(buffers, fresh):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(src)
                return fresh
            source = input_sets[sample % len(input_sets)]
            perms: dict[int, torch.Tensor] = {}
            for buf, src in zip(buffers, source):
                if not isinstance(buf, torch.Tensor):
                    continue
                if buf.dim() > 0 and buf.shape[0] > 1:
                    perm = perms.setdefault(buf.shape[0], torch.randperm(buf.shape[0], device=self.device, generator=generator))
                    buf.copy_(src.index_select(0, perm))
                else:
                    buf.copy_(src)
            return None

        def restore(pristine: list[Any]) -> None:
            for buf, orig in zip(buffers, pristine):
                if isinstance(buf, torch.Tensor):
                    buf.copy_(orig)

        ref_model, cand_model = self.ref_model, self.cand_model

        def call_ref() -> Any:
            return ref_model(*buffers)

        def call_cand() -> Any:
            try:
                return cand_model(*buffers)
            except Exception as exc:  # noqa: BLE001 - tagged: the candidate's failure, not the harness's
                raise CandidateFailed(f"{type(exc).__name__}: {exc}") from exc

        with torch.no_grad():  # entered once: nothing but the forward call sits between the two events
            floors_start = self._perf_counter()
            floors = self._launch_floors_ms(flush, start, end)
            warm_start = self._perf_counter()
            warm_calls = 0

            def warm_pair() -> float:
                nonlocal warm_calls
                load_fresh_inputs(warm_calls)
                start.record()
                call_ref()
                call_cand()
                end.record()
                self._synchronize()
                warm_calls += 1
                return start.elapsed_time(end)

            _, warm_steady = warm_up(warm_pair, min(cfg.warmup_min_seconds, cfg.warmup_seconds), cfg.warmup_seconds,
                                     self._perf_counter)
            pair_s = (self._perf_counter() - warm_start) / warm_calls
            # Fewer pairs where each is slow: the budget bounds timing, with at least timing_min_samples pairs.
            min_pairs = max(cfg.timing_min_samples, min(cfg.timing_samples, int(cfg.timing_budget_s / (2 * pair_s))))
            times: dict[str, dict[str, list[float]]] = {c: {"ref": [], "cand": []} for c in ("gpu", "host")}
            walls: dict[str, list[float]] = {"ref": [], "cand": []}
            ratios: dict[str, list[float]] = {"gpu": [], "host": []}
            recheck = "nondeterministic_reference" not in j.flags
            timing_start, rounds, sample = self._perf_counter(), 1, 0
            while True:
                if sample and sample % cfg.timing_round_samples == 0:
                    # New allocations while the old ones are alive, so the round gets other addresses.
                    fresh = clone(buffers)
                    buffers[:] = fresh
                    del fresh
                    rounds += 1
                drawn = load_fresh_inputs(sample + warm_calls)
                origin = (f"a fresh get_inputs() draw seeded {cfg.seed + 2000 + sample + warm_calls}"
                          if drawn is not None else
                          f"stored input set {(sample + warm_calls) % len(input_sets)} (get_inputs() seeded "
                          f"{cfg.seed + 1000 + (sample + warm_calls) % len(input_sets)}), its rows permuted by a "
                          f"generator seeded {cfg.seed}")
                # The draw is a pristine copy already, unless get_inputs() handed back the buffers themselves (a
                # task that caches its inputs): then only a clone is one.
                pristine = drawn if drawn is not None and not shares_memory(drawn, buffers) else clone(buffers)
                conventions = ("gpu", "host") if sample % 2 == 0 else ("host", "gpu")
                order = ("ref", "cand") if (sample // 2) % 2 == 0 else ("cand", "ref")
                for convention in conventions:
                    outputs: dict[str, Any] = {}
                    for which in order:
                        fn = call_ref if which == "ref" else call_cand
                        if convention == "gpu":
                            outputs[which], ms = self._timed_gpu(fn, flush, start, end)
                        else:
                            outputs[which], ms, wall = self._timed_host(fn, flush, start, end)
                            walls[which].append(wall)
                        times[convention][which].append(ms)
                        if which == "ref":
                            restore(pristine)  # the reference may legitimately work in place
                        else:
                            reject_mutated_inputs(pristine, buffers, f"during timed call {sample}")
                    r_ms, c_ms = times[convention]["ref"][-1], times[convention]["cand"][-1]
                    ratios[convention].append(r_ms / c_ms if c_ms > 0 else math.inf)
                    if recheck and not self._output_right(outputs["ref"], outputs["cand"]):
                        self._judge_timed_mismatch(sample, pristine, self._wrong_by(outputs["ref"], outputs["cand"]),
                                                   origin)
                    del outputs
                del pristine
                sample += 1
                out_of_time = self._perf_counter() - timing_start > cfg.timing_budget_s
                if sample >= min_pairs and (sample % cfg.timing_round_samples == 0 or out_of_time
                                            or sample >= cfg.timing_max_samples):
                    low, high = median_interval(ratios[cfg.speedup_convention])
                    precise = (high - low) / 2 <= cfg.timing_target_precision * statistics.median(
                        ratios[cfg.speedup_convention])
                    if (sample >= cfg.timing_samples and precise) or out_of_time or sample >= cfg.timing_max_samples:
                        break
        timing_end = self._perf_counter()
        self.guard.check("during timing")
        chosen = cfg.speedup_convention
        stats = {c: (timing_stats(times[c]["ref"]), timing_stats(times[c]["cand"])) for c in ("gpu", "host")}
        speedups = {c: statistics.median(ratios[c]) for c in ("gpu", "host")}
        ref_stats, cand_stats = stats[chosen]
        j.fields.update(reference_timing=ref_stats, candidate_timing=cand_stats,
                        speedup=speedups[chosen] if math.isfinite(speedups[chosen]) else None,
                        speedup_gpu=speedups["gpu"] if math.isfinite(speedups["gpu"]) else None,
                        speedup_host=speedups["host"] if math.isfinite(speedups["host"]) else None,
                        speedup_convention=chosen)
        other = "host" if chosen == "gpu" else "gpu"
        cand_wall_med, ref_wall_med = statistics.median(walls["cand"]), statistics.median(walls["ref"])
        j.fields.setdefault("provenance", {}).update(
            launch_floor_ms=floors[chosen], launch_floors_ms=floors,
            reference_wall_median_ms=ref_wall_med, candidate_wall_median_ms=cand_wall_med,
            timing_inputs=("a fresh get_inputs() draw on the GPU for every call" if draws_on_device else
                           f"{len(input_sets)} stored input set(s), rows re-permuted for every call"),
            speedup_ci95=[low, high],
            speedup_of_medians=(ref_stats.median_ms / cand_stats.median_ms if cand_stats.median_ms > 0 else None),
            **{f"reference_median_ms_{other}": stats[other][0].median_ms,
               f"candidate_median_ms_{other}": stats[other][1].median_ms},
            timing_pairs=sample, timing_rounds=rounds, timing_min_pairs=min_pairs,
            warmup_pairs=warm_calls, warmup_steady=warm_steady,
            # Where the timing phase's wall time went: launch floors, warm-up, and the timed pairs with the work
            # around each (fresh draw, clone/restore, input and output checks).
            timing_split_s={"launch_floors": round(warm_start - floors_start, 4),
                            "warmup": round(timing_start - warm_start, 4),
                            "pairs": round(timing_end - timing_start, 4)})
        # Work on a side stream or thread is invisible to the events but not to a device-wide sync.
        host_ref, host_cand = stats["host"]
        ref_excess = max(ref_wall_med - host_ref.median_ms, 0.0)
        cand_excess = cand_wall_med - host_cand.median_ms
        if cand_excess > max(1.0 * host_cand.median_ms, 0.05) + 2 * ref_excess:
            raise Rejection(Status.DECEPTIVE, "work_outside_timed_stream",
                            f"wall clock to device sync {cand_wall_med:.3f} ms vs {host_cand.median_ms:.3f} ms on the "
                            "timed stream: work escapes the timer", "anti_gaming")
        if ref_stats.median_ms < cfg.overhead_floor_multiple * floors[chosen]:
            j.flag("overhead_dominated")
