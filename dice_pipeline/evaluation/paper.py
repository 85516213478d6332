"""The paper's published KernelBench numbers (DICE project page headline table, NOTES.md section 1): Exec / fast1 /
fast2 in percent per level, measured on their hardware at atol=rtol=1e-2. Shown beside ours, never mixed into them.
"""

from __future__ import annotations

PAPER_SOURCE = "DICE (arXiv 2602.11715) project page, headline table; their GPU, 1e-2 tolerance, eager baseline"
# model -> level -> (Exec %, fast1 %, fast2 %)
PAPER_RESULTS: dict[str, dict[int, tuple[float, float, float]]] = {
    "DICE-8B": {1: (40, 9, 5), 2: (39, 14, 0), 3: (16, 8, 4)},
    "DICE-4B": {1: (27, 13, 4), 2: (24, 15, 9), 3: (12, 6, 4)},
    "DICE-1.7B": {1: (24, 12, 3), 2: (6, 3, 2), 3: (10, 6, 4)},
    "cudaLLM-8B (AR)": {1: (46, 12, 7), 2: (34, 12, 6), 3: (6, 4, 0)},
    "Qwen3-8B (AR)": {1: (8, 1, 0), 2: (25, 11, 6), 3: (4, 2, 2)},
    "SDAR-8B-Chat (base)": {1: (6, 2, 1), 2: (2, 0, 0), 3: (0, 0, 0)},
}
