"""tdshare quick start: several processes share one memory-mapped TensorDict.

The parent saves a TensorDict to a folder (``memmap_``) and hands it to worker processes.  Each
worker reads the shared data and writes its own row in place (no bytes are copied or pickled:
every process maps the same files), worker 0 adds a new entry that the parent picks up with
``memmap_refresh_()``, and a shared non-tensor status string is updated live.  Then the folder is
loaded again from disk and packed into a single ``.tdz`` archive.

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
    if rank == 0:
        td.make_memmap("bonus", [td.batch_size[0]])[:] = 1.5  # a new entry, for everyone after a refresh
        td.set_("status", "worker 0 was here")  # a shared non-tensor value: seen at once
    results.put((rank, seen, td["info", "episode"][rank].item(), type(td["obs"]).__name__))


def main() -> None:
    n_workers = 3
    with tempfile.TemporaryDirectory() as root:
        folder = f"{root}/td"
        td = TensorDict(
            {
                "obs": torch.arange(n_workers * 4, dtype=torch.float32).reshape(n_workers, 4),
                "reward": torch.zeros(n_workers),
                "info": {"episode": torch.arange(n_workers)},
                "status": "created",
            },
            batch_size=[n_workers],
        )
        td.memmap_(folder, share_non_tensor=True)  # every leaf is now a MemoryMappedTensor in `folder`
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
        print("shared status:", td["status"])
        assert td["reward"].tolist() == [10.0, 20.0, 30.0]
        assert anon["counter"].tolist() == [1, 2, 3]

        td.memmap_refresh_()  # maps the entry worker 0 added; a no-op refresh costs microseconds
        print("entry added by worker 0, after refresh:", td["bonus"].tolist())

        loaded = TensorDict.load(folder)  # maps the files again; reads metadata only
        assert (loaded == td).all()
        print("reloaded from disk:", loaded["reward"].tolist(), loaded["status"])

        # one zip file; stored leaves load as zero-copy views.  The leaves already live in `folder`:
        # copy_existing=True says that copying them into the archive is meant.
        archive = td.save(f"{root}/td.tdz", copy_existing=True)
        print("archive:", sorted(archive.keys()), archive["bonus"].sum().item())


if __name__ == "__main__":
    main()
