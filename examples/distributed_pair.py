"""Two ranks exchange a TensorDict over torch.distributed (gloo), launched two ways.

python examples/distributed_pair.py                                  # mp.spawn, 2 ranks
torchrun --nproc-per-node 2 examples/distributed_pair.py             # torchrun sets RANK etc.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tdshare import TensorDict
from tdshare import distributed as tdd


def run(rank: int, world: int) -> None:
    """What each rank does once the process group is up."""
    if rank == 0:
        td = TensorDict(obs=torch.arange(8.0).view(4, 2), tag="hello", batch_size=[4])
        tdd.send(td, dst=1, timeout=30)  # the schema, then one buffer per dtype
    else:
        buffer = TensorDict(obs=torch.zeros(4, 2), tag="", batch_size=[4]).memmap_()  # preallocated
        tdd.recv(buffer, src=0, timeout=30)  # written in place
        print(f"rank 1 received obs sum={buffer['obs'].sum().item()} tag={buffer['tag']}", flush=True)
    everyone = tdd.all_gather(TensorDict(rank=torch.tensor([rank]), batch_size=[]), timeout=30)
    assert everyone["rank"].view(-1).tolist() == list(range(world))


def _spawned(rank: int, world: int, store: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        run(rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("gloo")
        run(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
    else:
        with tempfile.TemporaryDirectory() as folder:
            mp.spawn(_spawned, args=(2, os.path.join(folder, "store")), nprocs=2)
