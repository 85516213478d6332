"""How the training loops spread a model over the processes of a `torchrun` job: DDP (a whole replica a rank, the
gradients all-reduced) for small models, FSDP2 (`torch.distributed.fsdp.fully_shard`: parameters, gradients and
optimizer state sharded over the ranks, each decoder layer gathered only while it runs) for the paper's 1.7B-8B
models, with optional activation checkpointing and bf16 mixed precision. Also what sharding changes elsewhere:
gradient clipping over shards, the full weights gathered for export, and an unsharded replica for RL rollouts (the
sampler's forward count differs by rank, which sharded forwards, collective each, cannot allow).

GPU-side code: torch and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from training.distributed import Processes

PARALLELISM = ("auto", "ddp", "fsdp")
MIXED_PRECISION = ("auto", "bf16", "fp32")
# `auto` shards from this size up. Below it a replica with AdamW state (16 bytes a parameter: fp32 weights,
# gradients, two moments) fits one 80 GB GPU with room for activations; from ~4B parameters it does not fit at all.
FSDP_AUTO_PARAMETERS = 1_000_000_000


@dataclass
class ParallelSettings:
    """The fields a training stage's config adds for running across processes (SFTConfig and RLConfig inherit them).

    `parallelism`: `ddp`, `fsdp`, or `auto` (FSDP from FSDP_AUTO_PARAMETERS parameters up, else DDP). One process
    uses neither unless `fsdp` is asked for (FSDP on one rank: what the single-GPU measurement runs).
    `activation_checkpointing`: recompute each decoder layer in the backward pass instead of keeping its
    activations (about a third more compute, activation memory of one layer instead of all).
    `mixed_precision`: `bf16` (weights kept in fp32; compute in bf16: FSDP's param dtype, autocast otherwise;
    gradients reduced in fp32), `fp32`, or `auto` (bf16 on CUDA, fp32 on the CPU, where gloo and most kernels
    have no bf16 path worth testing)."""

    parallelism: str = "auto"
    activation_checkpointing: bool = False
    mixed_precision: str = "auto"

    def check_parallel_settings(self) -> None:
        if self.parallelism not in PARALLELISM:
            raise ValueError(f"parallelism must be one of {PARALLELISM}, got {self.parallelism!r}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")


def choose_strategy(parallelism: str, num_parameters: int, world: int) -> str:
    """`single` (one process, plain model), `ddp` or `fsdp`."""
    if parallelism not in PARALLELISM:
        raise ValueError(f"parallelism must be one of {PARALLELISM}, got {parallelism!r}")
    if parallelism == "fsdp" or (parallelism == "auto" and world > 1 and num_parameters >= FSDP_AUTO_PARAMETERS):
        return "fsdp"
    return "ddp" if world > 1 else "single"


def compute_dtype(mixed_precision: str, device: torch.device) -> torch.dtype:
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
    if mixed_precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if mixed_precision == "bf16" else torch.float32


def autocast(device: torch.device, mixed_precision: str):
    """The forward's autocast context: bf16 when the settings compute in bf16 (a no-op for an FSDP model already
    gathered in bf16, what turns on bf16 matmuls for a replicated one)."""
    dtype = compute_dtype(mixed_precision, device)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model, processes: Processes, param_dtype: torch.dtype = torch.float32,
                reshard_after_forward: bool = True):
    """FSDP2 in place: every decoder layer a unit of its own (gathered for its forward and again for its backward);
    an untied input embedding and LM head units of their own too (SDAR-4B/8B: 0.4-0.6B parameters each, so their
    gathered weights and unsharded gradients are never alive together); the rest (final norm, a tied
    embedding/head) the root unit. Weights stay fp32 in the shards (what AdamW updates); `param_dtype` is what they
    are gathered in for compute, gradients are reduced in fp32. Parameters on the CPU move to this rank's device
    one unit at a time, so the full model never sits on one GPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not processes.active:
        raise RuntimeError("FSDP needs a process group: Processes.join(one_process_group=True) first")
    device = processes.device()
    mesh = init_device_mesh(device.type, (processes.world,))
    policy = MixedPrecisionPolicy(param_dtype=None if param_dtype == torch.float32 else param_dtype,
                                  reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        fully_shard(model.model.embed_tokens, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
        # The head runs last in the forward and first in the backward: gathering it twice would buy nothing.
        fully_shard(model.lm_head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    # The root's weights are needed again at once by the backward: keeping them gathered saves an all-gather.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def prepare_model(model, settings: ParallelSettings, processes: Processes) -> str:
    """Get `model` (full, on the CPU or a device, the same weights on every rank) ready to train under `settings`:
    activation checkpointing on or off, then sharded (FSDP) or moved to this rank's device. Returns the strategy
    (`single`, `ddp` or `fsdp`); a DDP wrapper, when needed, is the loop's (it wraps what computes the loss)."""
    strategy = choose_strategy(settings.parallelism, sum(p.numel() for p in model.parameters()), processes.world)
    model.model.gradient_checkpointing = bool(settings.activation_checkpointing)
    processes.same_parameters(model)  # before sharding: the shards are cut from the same whole on every rank
    device = processes.device()
    if strategy == "fsdp":
        shard_model(model, processes, compute_dtype(settings.mixed_precision, device))
    else:
        model.to(device)
    return strategy


def clip_gradients(model, max_norm: float) -> float:
    """clip_grad_norm_ over every rank's shards (the norm of the whole gradient); returns that norm."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor: the norm of the sharded gradients, reduced over the ranks
        norm = norm.full_tensor()
    return float(norm)


# ------------------------------------------------------------------------------------------- whole weights out
def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU: gathered from the shards (a collective: every rank calls it; rank 0
    gets them, the others an empty dict), or the model's own state dict when it is not sharded."""
    if not is_sharded(model):
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def unsharded_class(model) -> type:
    """The model's own class (FSDP2 swaps in a subclass named FSDP<class>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def save_pretrained_weights(model, path: str | Path, state_dict: dict[str, torch.Tensor]) -> None:
    """Write a `from_pretrained` folder of `state_dict` with `model`'s config and class, without building a second
    full model: an empty (meta-device) shell of the class saves the given tensors."""
    with torch.device("meta"):
        shell = unsharded_class(model)(model.config)
    # Gathered shards of tied weights (a tied LM head) arrive as separate tensors, which save_pretrained would write
    # twice; the unsharded model's export has the first name only.
    names_of: dict[int, list[str]] = {}
    for name, param in shell.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    tied = {name for names in names_of.values() for name in names[1:]}
    shell.save_pretrained(path, state_dict={k: v for k, v in state_dict.items() if k not in tied})


# --------------------------------------------------------------------------------------- sharded training state
def save_sharded_state(path: str | Path, model, optimizer) -> None:
    """Model and optimizer state with torch.distributed.checkpoint: every rank writes its own shards (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))


def load_sharded_state(path: str | Path, model, optimizer) -> None:
    """Read a `save_sharded_state` folder into `model` and `optimizer`, sharded or not and at any world size
    (torch.distributed.checkpoint reshards on load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Load whole (unsharded) weights and a plain `optimizer.state_dict()` (keyed by parameter index) into a
    sharded model and its optimizer: each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = [name for name, _ in model.named_parameters()]  # the optimizer's parameter order
    by_name = dict(state={names[i]: s for i, s in optimizer_state["state"].items()},
                   param_groups=[dict(g, params=[names[i] for i in g["params"]])
                                 for g in optimizer_state["param_groups"]])
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=by_name,
                   options=StateDictOptions(full_state_dict=True))


# ------------------------------------------------------------------------------------------------- RL rollouts
class RolloutReplica:
    """An unsharded copy of a sharded model for sampling: decoding runs a different number of forwards on every
    rank (rows stop at their EOS, dynamic unmasking), and every forward of a sharded model is a collective, so the
    sampler needs whole weights. `sync()` (collective) refreshes them from the shards one parameter at a time: no
    more than one whole parameter in flight beyond the replica itself, kept in the compute dtype (bf16 on GPUs:
    8B parameters take 16 GB beside the shards)."""

    def __init__(self, model, dtype: torch.dtype, device: torch.device) -> None:
        with torch.device("meta"):
            replica = unsharded_class(model)(model.config)
        # Cast while still on the meta device: the replica is allocated once, in its own dtype (8B parameters
        # allocated in fp32 first would take 32 GB on the way to 16).
        self.model = replica.to(dtype).to_empty(device=device).eval()
        self.model.tie_weights()  # to_empty gives every parameter new storage, a tied head included
        self.model.requires_grad_(False)
        self.source = model
        mine, theirs = {n for n, _ in self.model.named_parameters()}, {n for n, _ in model.named_parameters()}
        if mine != theirs:
            raise ValueError(f"the replica's parameters differ from the model's: {sorted(mine ^ theirs)[:5]}")

    @torch.no_grad()
    def sync(self):
        params = dict(self.model.named_parameters())
        for name, param in self.source.named_parameters():
            whole = param.full_tensor() if hasattr(param, "full_tensor") else param
            params[name].copy_(whole)
        return self.model
