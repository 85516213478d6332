"""Attention/MLP structure synthesis: the catalogue of LLM sub-module reference tasks, the kernel generator
backends (OpenAI-compatible endpoint, local transformers / block-diffusion checkpoint, built-in CUDA templates) and
the candidate -> verdict -> kept/rejected rows behind the `structure_instances` asset. No torch at import time.
"""

from dice_pipeline.synthesis.candidates import (
    GeneratedCandidate,
    GenerationError,
    KernelGenerator,
    UnsupportedTaskError,
)
from dice_pipeline.synthesis.catalogue import StructureTask, make_structure_task, structure_catalogue
from dice_pipeline.synthesis.instances import (
    STRUCTURE_INSTANCE_COLUMNS,
    judge_verdict,
    synthesize_structure_instances,
)
from dice_pipeline.synthesis.local_model import TransformersGenerator
from dice_pipeline.synthesis.openai_compatible import OpenAICompatibleConfig, OpenAICompatibleGenerator
from dice_pipeline.synthesis.templates import TemplateGenerator

__all__ = [
    "STRUCTURE_INSTANCE_COLUMNS",
    "GeneratedCandidate",
    "GenerationError",
    "KernelGenerator",
    "OpenAICompatibleConfig",
    "OpenAICompatibleGenerator",
    "StructureTask",
    "TemplateGenerator",
    "TransformersGenerator",
    "UnsupportedTaskError",
    "judge_verdict",
    "make_structure_task",
    "structure_catalogue",
    "synthesize_structure_instances",
]
