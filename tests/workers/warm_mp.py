# multiprocessing (fork and spawn), torch.multiprocessing.spawn and a DataLoader inside a worker.
import multiprocessing as mp
import os

import torch
import torch.multiprocessing


def square(x):
    return x * x


def child(index, queue):
    queue.put((index, os.environ["RANK"], __name__))


if __name__ == "__main__":
    with mp.get_context("fork").Pool(2) as pool:
        print("fork", pool.map(square, [1, 2, 3]), flush=True)
    with mp.get_context("spawn").Pool(1) as pool:
        print("spawn", pool.map(square, [4, 5]), flush=True)
    queue = torch.multiprocessing.get_context("spawn").SimpleQueue()
    torch.multiprocessing.spawn(child, args=(queue,), nprocs=2)
    print("mp.spawn", sorted(queue.get() for _ in range(2)), flush=True)
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=2)
    print("loader", [batch[0].tolist() for batch in loader], flush=True)
