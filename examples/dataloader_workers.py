"""DataLoader workers reading one memory-mapped dataset with zero copies.

The dataset is saved once as a folder of memory-mapped leaves.  A ``torch.utils.data.DataLoader``
with two worker processes receives the TensorDict as a small handle (paths, dtypes, shapes),
and each worker maps the same files: batches are gathered straight from the page cache.

Run:  python examples/dataloader_workers.py
"""

from __future__ import annotations

import pickle
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset

from tdshare import TensorDict


class RowDataset(Dataset):
    """Rows of a memory-mapped TensorDict; the TensorDict pickles as a handle, not its bytes."""

    def __init__(self, td: TensorDict) -> None:
        self.td = td

    def __len__(self) -> int:
        return self.td.batch_size[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.td[index]
        return {"obs": row["obs"].clone(), "label": row["label"].clone()}


def main(rows: int = 10_000, num_workers: int = 2) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = TensorDict(
            obs=torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8),
            label=torch.arange(rows) % 10,
            batch_size=[rows],
        )
        td = data.memmap(folder)  # the dataset on disk, mapped
        print(f"pickled handle: {len(pickle.dumps(td))} bytes for {rows * 8 * 4 + rows * 8} bytes of data")

        loader = DataLoader(
            RowDataset(td),
            batch_size=256,
            shuffle=True,
            num_workers=num_workers,
            multiprocessing_context="spawn",
            persistent_workers=False,
        )
        seen = torch.zeros(rows, dtype=torch.bool)
        total = 0.0
        for batch in loader:
            index = batch["obs"][:, 0].long() // 8  # each row starts at 8 * row_index
            assert torch.equal(batch["label"], index % 10)
            seen[index] = True
            total += batch["obs"].double().sum().item()
        assert bool(seen.all()), "every row is read exactly once per epoch"
        assert total == float(data["obs"].double().sum())
        print(f"{num_workers} workers read all {rows} rows; sum of obs = {total:.0f}")


if __name__ == "__main__":
    main()
