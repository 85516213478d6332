"""How fast the operator-family generator writes pairs, against the structure-synthesis template generator (the
project's other offline generator) in the same process:

    python benchmarks/synthetic_generation.py [--seed 0] [--repeats 3] [--json OUT.json]

Prints seconds per 1,000 pairs for both and their ratio (CPU only; no GPU involved).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dice_pipeline.synthesis import TemplateGenerator, structure_catalogue  # noqa: E402
from dice_pipeline.synthesis.operators import generate_operator_instances  # noqa: E402


def time_operator_families(seed: int) -> tuple[float, int]:
    start = time.perf_counter()
    instances = generate_operator_instances(seed)
    return time.perf_counter() - start, len(instances)


def time_structure_templates() -> tuple[float, int]:
    tasks = structure_catalogue()
    generator = TemplateGenerator()
    start = time.perf_counter()
    made = sum(len(generator.generate(task.pytorch_code, 1, seed=0)) for task in tasks)
    return time.perf_counter() - start, made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    ours = min((time_operator_families(args.seed) for _ in range(args.repeats)), key=lambda r: r[0])
    base = min((time_structure_templates() for _ in range(args.repeats)), key=lambda r: r[0])
    ours_per_1000 = 1000 * ours[0] / ours[1]
    base_per_1000 = 1000 * base[0] / base[1]
    result = {"operator_families": {"pairs": ours[1], "seconds": round(ours[0], 3),
                                    "seconds_per_1000_pairs": round(ours_per_1000, 3)},
              "structure_templates": {"pairs": base[1], "seconds": round(base[0], 3),
                                      "seconds_per_1000_pairs": round(base_per_1000, 3)},
              "ratio_templates_over_operator_families": round(base_per_1000 / ours_per_1000, 2)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
