#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch's CPU collectives (torch.distributed with the gloo backend), a second baseline of the
device-mode benchmarks beside OpenMPI's (mpi_baseline.cpp), timed the same way.

It starts N worker processes itself (torch.multiprocessing, a FileStore in a temporary
directory, gloo over the loopback interface), each with torch.set_num_threads(1), and for each
collective and per-rank size in bytes times, on float32 tensors:

  psum          dist.all_reduce(SUM), in place (PyTorch's all-reduce has no out-of-place form)
  all_gather    dist.all_gather into a preallocated list of N tensors (views of one output);
                gloo in PyTorch 1.13 has no all_gather_into_tensor
  psum_scatter  dist.all_reduce(SUM) in place, then this rank's slice (a view): gloo in PyTorch
                1.13 has no reduce_scatter (nor reduce_scatter_tensor), so this is what a
                PyTorch user does on gloo; an all-reduce moves about twice the bytes a
                reduce-scatter needs and writes the whole sum on every rank
  all_to_all    dist.all_to_all_single into a preallocated output (gloo has no list all_to_all)
  ppermute      dist.irecv from rank - 1 posted, then dist.isend to rank + 1, wait both (the
                ring of mpi_baseline's MPI_Sendrecv; batch_isend_irecv measured slower here)

Conventions of mpi_baseline.cpp: floats per rank max(1, bytes / 4), rounded up to a multiple of
N for psum_scatter and all_to_all; a warm-up call, whose result is checked once (a wrong call
stops the run), then one timed call on every rank to choose a batch length of about 20 ms
(1 to 2000 calls), then the best of several batches (7 below 1 MiB, 5 from 1 MiB, 3 from
16 MiB, 2 from 64 MiB, 1 when a call takes more than 2 s) of the slowest rank's time per call
(dist.barrier before each batch, an all_reduce(MAX) of the ranks' times after). all_gather
sizes whose gathered outputs of all ranks together (N x N x size) exceed --gather-cap-mib are
skipped, as in the suite. Rank 0 prints one CSV row per case on stdout, in mpi_baseline's
columns (impl,collective,devices,bytes,actual_bytes,seconds) with impl "gloo"; notes go to
stderr. Python standard library and torch only.

  python3 benchmarks/torch_collectives.py --np 4 --sizes 4,1024,65536,1048576 \\
      [--collectives psum,all_gather,psum_scatter,all_to_all,ppermute] [--gather-cap-mib 2048] \\
      [--header]
"""
import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time

COLLECTIVES = ["psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"]
CALLS = {  # what each collective is in PyTorch (bench.sh prints these)
    "psum": "all_reduce",
    "all_gather": "all_gather",
    "psum_scatter": "all_reduce + slice",
    "all_to_all": "all_to_all_single",
    "ppermute": "irecv/isend ring",
}
MIB = 1 << 20


def repetitions(nbytes):  # the same policy as bench_common.hpp and mpi_baseline.cpp
    if nbytes >= 64 * MIB:
        return 2
    if nbytes >= 16 * MIB:
        return 3
    if nbytes >= MIB:
        return 5
    return 7


def elements(collective, nbytes, n):
    e = max(1, nbytes // 4)
    if collective in ("psum_scatter", "all_to_all"):
        e = (e + n - 1) // n * n
    return e


def worker(rank, n, store_path, collectives, sizes, gather_cap_mib):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=300))
    nxt, prev = (rank + 1) % n, (rank - 1) % n

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    for c in collectives:
        for nbytes in sizes:
            if c == "all_gather" and n * n * nbytes > gather_cap_mib * MIB:
                if rank == 0:
                    print(f"# {c} np={n} {nbytes} B: skipped, the gathered outputs of all ranks would "
                          f"exceed {gather_cap_mib} MiB", file=sys.stderr, flush=True)
                continue
            e = elements(c, nbytes, n)
            block = e // n
            if c == "psum":
                buf = torch.full((e,), float(rank))
                call = lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM)  # noqa: E731
                check = lambda: bool(torch.all(buf == n * (n - 1) / 2))  # noqa: E731
            elif c == "all_gather":
                x = torch.full((e,), float(rank))
                out = torch.empty(n * e)
                parts = list(out.chunk(n))
                call = lambda: dist.all_gather(parts, x)  # noqa: E731
                check = lambda: all(bool(torch.all(parts[j] == j)) for j in range(n))  # noqa: E731
            elif c == "psum_scatter":
                buf = torch.full((e,), float(rank))
                result = [None]

                def call():
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                    result[0] = buf[rank * block:(rank + 1) * block]

                def check():
                    return result[0].numel() == block and bool(torch.all(result[0] == n * (n - 1) / 2))
            elif c == "all_to_all":
                x = torch.arange(n, dtype=torch.float32).repeat_interleave(block) + rank * n  # block j: rank*n + j
                out = torch.empty(e)
                call = lambda: dist.all_to_all_single(out, x)  # noqa: E731
                expect = torch.arange(n, dtype=torch.float32).repeat_interleave(block) * n + rank
                check = lambda: bool(torch.equal(out, expect))  # noqa: E731
            elif c == "ppermute":
                x = torch.full((e,), float(rank))
                out = torch.empty(e)

                def call():
                    r = dist.irecv(out, prev)
                    s = dist.isend(x, nxt)
                    s.wait()
                    r.wait()

                check = lambda: bool(torch.all(out == prev))  # noqa: E731
            else:
                raise SystemExit(f"unknown collective {c}")

            # Warm-up, checked once on every rank, then one timed call to choose the batch length.
            call()
            ok = slowest(0.0 if check() else 1.0) == 0.0
            if not ok:
                raise SystemExit(f"torch_collectives: {c} np={n} {nbytes} B gave a wrong result")
            dist.barrier()
            start = time.perf_counter()
            call()
            one = slowest(time.perf_counter() - start)
            k = min(max(int(0.02 / max(one, 1e-9)), 1), 2000)
            reps = 1 if one > 2.0 else repetitions(nbytes)
            best = float("inf")
            for _ in range(reps):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(k):
                    call()
                best = min(best, slowest((time.perf_counter() - start) / k))
            if rank == 0:
                print(f"gloo,{c},{n},{nbytes},{e * 4},{best:.9g}", flush=True)
            del call, check
            buf = x = out = parts = result = None  # noqa: F841  free the buffers before the next size
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, required=True, help="number of processes (ranks)")
    p.add_argument("--sizes", required=True, help="per-rank sizes in bytes, comma-separated")
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--collective", dest="collectives", help="one collective (same as --collectives)")
    p.add_argument("--gather-cap-mib", type=int, default=2048)
    p.add_argument("--header", action="store_true", help="print the CSV header line first")
    a = p.parse_args()
    collectives = [c for c in a.collectives.split(",") if c]
    for c in collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c} (known: {', '.join(COLLECTIVES)})")
    sizes = [int(s) for s in a.sizes.split(",") if s]

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        print("torch_collectives: this PyTorch has no gloo backend", file=sys.stderr)
        return 1
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: gloo's TCP over loopback
    if "psum_scatter" in collectives:
        print(f"# PyTorch {torch.__version__}: gloo has no reduce_scatter; psum_scatter is timed as "
              "all_reduce then this rank's slice", file=sys.stderr, flush=True)
    if a.header:
        print("impl,collective,devices,bytes,actual_bytes,seconds", flush=True)
    tmp = tempfile.mkdtemp(prefix="torch_collectives_")
    try:
        mp.spawn(worker, args=(a.np, os.path.join(tmp, "store"), collectives, sizes, a.gather_cap_mib),
                 nprocs=a.np, join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
