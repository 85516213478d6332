"""The block partition and the prediction alignment that SFT, the RL replay and both decoders share, so a model is
decoded exactly as it was trained. SDAR's convention: blocks are counted from the sequence's first token, prompt
included (position p lies in block p // block_size), with no padding before the prompt. An L-token prompt fills
L // block_size whole blocks, which are prefilled; decoding starts in the block holding the prompt's last
L % block_size tokens, which are given and never masked (SDAR's generate.py, NOTES §4).
"""

from __future__ import annotations

import torch


def block_of(positions, block_size: int):
    """The block each position (an int or a tensor of positions, counted from the sequence's first token) is in."""
    return positions // block_size


def whole_prompt_blocks(prompt_length: int, block_size: int) -> int:
    """How many blocks the prompt fills completely: those are prefilled, never decoded."""
    return prompt_length // block_size


def first_decoded_block(prompt_length: int, block_size: int) -> int:
    """The block the answer starts in (it also holds the prompt's last prompt_length % block_size tokens)."""
    return prompt_length // block_size


def last_decoded_block(prompt_length: int, new_tokens: int, block_size: int) -> int:
    """The block holding the answer's last token (new_tokens >= 1)."""
    return (prompt_length + new_tokens - 1) // block_size


def decoded_span_end(prompt_length: int, new_tokens: int, block_size: int) -> int:
    """One past the last position decoded for an answer of `new_tokens` tokens: decoding writes whole blocks."""
    return (last_decoded_block(prompt_length, new_tokens, block_size) + 1) * block_size


def prediction_shift(config) -> int:
    """0: the token at position p is predicted from the hidden state at p (SDAR, DICE); 1: from the state at p - 1
    (Dream, Fast-dLLM v2, and our conversions of autoregressive models). Configs without the field are SDAR's."""
    return int(getattr(config, "prediction_shift", 0) or 0)


def predicting_positions(target_positions: torch.Tensor, shift: int) -> torch.Tensor:
    """The positions whose hidden states predict the tokens at `target_positions`."""
    return target_positions - shift
