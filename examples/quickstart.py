"""tdshare quick start: several processes share one memory-mapped TensorDict.

The parent saves a TensorDict to a folder (``memmap_``), hands it to worker processes, and each
worker reads the shared data and writes its own row in place.  No tensor bytes are copied or
pickled: each process maps the same files.  Then the folder is loaded again from disk.

Run:  python examples/quickstart.py
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile

import torch

from tdshare import MemoryMappedTensor, TensorDict


def worker(rank: int, td: TensorDict, anon: TensorDict, results: mp.Queue) -> None:
    # Both tensordicts arrived as small handles: the leaves map the parent's memory.
    seen = td["obs"][rank].sum().item()
    td["reward"][rank] = 10.0 * (rank + 1)  # in-place writes are visible to every process
    anon["counter"][rank] += rank + 1
    results.put((rank, seen, td["info", "episode"][rank].item(), type(td["obs"]).__name__))


def main() -> None:
    n_workers = 3
    with tempfile.TemporaryDirectory() as folder:
        td = TensorDict(
            {
                "obs": torch.arange(n_workers * 4, dtype=torch.float32).reshape(n_workers, 4),
                "reward": torch.zeros(n_workers),
                "info": {"episode": torch.arange(n_workers)},
                "env_name": "CartPole-v1",
            },
            batch_size=[n_workers],
        )
        td.memmap_(folder)  # every leaf is now a MemoryMappedTensor over a file in `folder`
        anon = TensorDict(counter=torch.zeros(n_workers, dtype=torch.int64), batch_size=[n_workers]).memmap_()
        print(f"saved to {folder}: is_memmap={td.is_memmap()} locked={td.is_locked}")
        assert isinstance(td["obs"], MemoryMappedTensor)

        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, td, anon, results)) for r in range(n_workers)]
        for p in procs:
            p.start()
        seen = sorted(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0, f"worker exited with {p.exitcode}"
        for rank, obs_sum, episode, leaf_type in seen:
            print(f"worker {rank}: obs row sum={obs_sum:.0f}, episode={episode}, leaf type={leaf_type}")

        print("rewards written by the workers:", td["reward"].tolist())
        print("anonymous shared counter:", anon["counter"].tolist())
        assert td["reward"].tolist() == [10.0, 20.0, 30.0]
        assert anon["counter"].tolist() == [1, 2, 3]

        loaded = TensorDict.load(folder)  # maps the files again; reads metadata only
        assert (loaded == td).all()
        print("reloaded from disk:", loaded["reward"].tolist(), loaded["env_name"])


if __name__ == "__main__":
    main()
