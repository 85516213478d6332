"""This process's place in a `torchrun` job, or a lone process: rank, world size and the few collectives the
training loops use. Without a process group every collective is the identity, so the same loops run on one device
and across several (data parallel: SFT shards each global batch across ranks, RL each step's tasks).
"""

from __future__ import annotations

import os

import torch


class Processes:
    def __init__(self) -> None:
        dist = torch.distributed
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.active else 0

    @classmethod
    def join(cls, one_process_group: bool = False) -> "Processes":
        """Under `torchrun` (WORLD_SIZE > 1), join the process group (gloo on CPU, nccl on GPUs) if not joined yet.
        `one_process_group`: a lone process gets a group of one too (FSDP needs one to shard over, even one rank):
        through torchrun's rendezvous when torchrun started it, else an in-memory store."""
        dist = torch.distributed
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if dist.is_initialized() or not (world > 1 or one_process_group):
            return cls()
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device:
        return torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")

    def _collective_device(self, device=None):
        if device is not None:
            return device
        return self.device() if torch.distributed.get_backend() == "nccl" else torch.device("cpu")

    def sum(self, value: float, device=None) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self._collective_device(device))
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def max(self, value: float, device=None) -> float:
        if not self.active:
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self._collective_device(device))
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor.item())

    def gather(self, items: list) -> list:
        """Every rank's list, concatenated in rank order, on every rank."""
        if not self.active:
            return list(items)
        gathered: list = [None] * self.world
        torch.distributed.all_gather_object(gathered, items)
        return [item for part in gathered for item in part]

    def from_rank_zero(self, value):
        if not self.active:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def sum_gradients(self, model) -> None:
        if not self.active:
            return
        for parameter in model.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            torch.distributed.all_reduce(parameter.grad)

    def same_parameters(self, model) -> None:
        """Start every rank from rank 0's weights."""
        if self.active:
            for tensor in list(model.parameters()) + list(model.buffers()):
                torch.distributed.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()
