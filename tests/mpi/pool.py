"""A process pool built on MPI_Comm_spawn (mpi4py.futures, Debian's python3-mpi4py):
`prun -n 1 python3 pool.py [WORKERS]` maps a function over 100 inputs on spawned workers and
checks every result against the same function computed here."""
import sys

from mpi4py.futures import MPIPoolExecutor


def work(x):
    return x * x + 1


if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with MPIPoolExecutor(max_workers=workers) as pool:
        got = list(pool.map(work, range(100)))
    want = [work(x) for x in range(100)]
    print("pool of %d mapped %d inputs: %s" % (workers, len(got), "ok" if got == want else "FAIL"))
    sys.exit(0 if got == want else 1)
