#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Joins the raw CSV files of one benchmark run (device_collectives, vectorized_collectives,
mpi_baseline, torch_collectives, training_step, torch_training_step), prints every case with
its ratios to the baselines of the same run and the target lines of the performance issue
with "met" or "missed", and writes:

  bench.csv     every measurement with its bus bandwidth (the input of plot.py)
  targets.csv   one row per target line
  summary.json  the targets and the run's settings

Usage: report.py <results dir> [<raw csv> ...]     (Python standard library only)
"""
import csv
import json
import os
import sys

MIB = 1 << 20
DEVICE_COLLECTIVES = ["psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"]
MPI_NAMES = {
    "psum": "MPI_Allreduce",
    "all_gather": "MPI_Allgather",
    "psum_scatter": "MPI_Reduce_scatter_block",
    "all_to_all": "MPI_Alltoall",
    "ppermute": "MPI_Sendrecv ring",
}
TORCH_NAMES = {  # PyTorch's gloo call for each collective (benchmarks/torch_collectives.py)
    "psum": "all_reduce",
    "all_gather": "all_gather",
    "psum_scatter": "all_reduce + slice",  # gloo in PyTorch 1.13 has no reduce_scatter
    "all_to_all": "all_to_all_single",
    "ppermute": "isend/irecv ring",
}


def bus_bandwidth(collective, n, actual_bytes, seconds):
    """NCCL-tests convention, bytes per second; actual_bytes is one device's input."""
    if seconds <= 0 or n <= 0:
        return 0.0
    s = float(actual_bytes)
    if collective == "psum":
        return 2 * (n - 1) / n * s / seconds
    if collective == "all_gather":
        return (n - 1) / n * n * s / seconds
    if collective in ("psum_scatter", "all_to_all"):
        return (n - 1) / n * s / seconds
    if collective == "ppermute":
        return s / seconds
    return s / seconds  # vectorized cases: bytes of the input per second


def human(b):
    if b >= MIB and b % MIB == 0:
        return f"{b // MIB} MiB"
    if b >= 1024 and b % 1024 == 0:
        return f"{b // 1024} KiB"
    return f"{b} B"


def load(paths):
    rows = []
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if not r.get("impl") or r["impl"] == "impl":
                    continue
                r["devices"] = int(r["devices"])
                r["bytes"] = int(r["bytes"])
                r["actual_bytes"] = int(r["actual_bytes"])
                r["seconds"] = float(r["seconds"])
                r["bus_GBps"] = bus_bandwidth(r["collective"], r["devices"], r["actual_bytes"], r["seconds"]) / 1e9
                rows.append(r)
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    out_dir = sys.argv[1]
    raw = sys.argv[2:] or [os.path.join(out_dir, f) for f in ("device.csv", "vectorized.csv", "mpi.csv", "gloo.csv",
                                                                  "training.csv", "torch_training.csv")]
    rows = load(raw)
    table = {(r["impl"], r["collective"], r["devices"], r["bytes"]): r for r in rows}

    def t(impl, collective, n, b):
        r = table.get((impl, collective, n, b))
        return r["seconds"] if r and r["seconds"] > 0 else None

    def best_mpi(collective, n, b):
        ts = [x for x in (t("openmpi", collective, n, b), t("openmpi_hugetlb", collective, n, b)) if x]
        return min(ts) if ts else None

    def ratio(base, mine):
        return base / mine if base and mine else None

    def fmt(x, width=8):
        return f"{x:{width}.2f}" if x is not None else f"{'-':>{width}}"

    # Every device case: namedax's time and bus bandwidth, and baseline time / namedax time.
    print("\n== device collectives (pmap): ratios = baseline time / namedax time, above 1 means namedax is faster ==")
    print(f"{'collective':<13}{'N':>3}{'size':>9}{'namedax':>15}{'bus GB/s':>10}{'hand thr':>10}{'mem bound':>10}"
          f"{'OpenMPI':>9}{'MPI+huge':>9}{'gloo':>9}")
    devices = sorted({r["devices"] for r in rows if r["collective"] in DEVICE_COLLECTIVES})
    sizes = sorted({r["bytes"] for r in rows if r["collective"] in DEVICE_COLLECTIVES})
    for c in DEVICE_COLLECTIVES:
        for n in devices:
            for b in sizes:
                if ("skipped", c, n, b) in table:
                    print(f"{c:<13}{n:>3}{human(b):>9}   skipped (memory cap)")
                    continue
                if ("too_slow", c, n, b) in table:
                    print(f"{c:<13}{n:>3}{human(b):>9}   skipped (the previous size took "
                          f"{table[('too_slow', c, n, b)]['seconds']:.1f} s per call)")
                    continue
                mine = t("namedax", c, n, b)
                if mine is None:
                    continue
                r = table[("namedax", c, n, b)]
                print(f"{c:<13}{n:>3}{human(b):>9}{mine * 1e6:>12.1f} us{r['bus_GBps']:>10.3f}"
                      f"{fmt(ratio(t('hand_threads', c, n, b), mine), 10)}{fmt(ratio(t('memory_bound', c, n, b), mine), 10)}"
                      f"{fmt(ratio(t('openmpi', c, n, b), mine), 9)}{fmt(ratio(t('openmpi_hugetlb', c, n, b), mine), 9)}"
                      f"{fmt(ratio(t('gloo', c, n, b), mine), 9)}")

    steps = [r for r in rows if r["collective"].endswith("_step")]

    def training_bytes(step):
        r = next((x for x in steps if x["collective"] == step and x["impl"].startswith("namedax")), None)
        return r["bytes"] if r else 0

    if steps:
        print("\n== one training step on a 2 x 2 mesh (forward, grad, SGD update), float32 ==")
        for step in ("mlp_step", "transformer_step"):
            for r in (x for x in steps if x["collective"] == step):
                print(f"{step:<18}{r['impl']:<24}{r['seconds'] * 1e3:>10.2f} ms")

    vcases = sorted({r["collective"] for r in rows if r["collective"].startswith("vmap_")})
    if vcases:
        print("\n== vectorized collectives (vmap): ratios = baseline time / namedax time ==")
        print(f"{'case':<22}{'size':>9}{'namedax':>12}{'hand':>8}{'hand fresh':>11}{'xtensor':>9}{'mem bound':>10}")
        for c in vcases:
            r = next(x for x in rows if x["collective"] == c and x["impl"] == "namedax")
            n, b, mine = r["devices"], r["bytes"], r["seconds"]
            print(f"{c:<22}{human(b):>9}{mine * 1e3:>9.2f} ms{fmt(ratio(t('hand_loop', c, n, b), mine))}"
                  f"{fmt(ratio(t('hand_loop_fresh', c, n, b), mine), 11)}{fmt(ratio(t('xtensor', c, n, b), mine), 9)}"
                  f"{fmt(ratio(t('memory_bound', c, n, b), mine), 10)}")

    # The target lines of the performance issue. value is a same-run ratio; met when
    # value >= threshold (or <= for "at most").
    targets = []

    def target(name, value, threshold, at_most=False, note=""):
        if value is None:
            status = "no data"
        else:
            status = "met" if (value <= threshold if at_most else value >= threshold) else "missed"
        targets.append({"target": name, "ratio": value, "threshold": threshold,
                        "comparison": "<=" if at_most else ">=", "status": status, "note": note})

    for b in (MIB, 16 * MIB, 64 * MIB):
        target(f"device psum N=2 {human(b)}: bus bandwidth / OpenMPI hugetlb MPI_Allreduce np=2",
               ratio(t("openmpi_hugetlb", "psum", 2, b), t("namedax", "psum", 2, b)), 2.0)
    target("device psum N=2 64 MiB: bus bandwidth / memory-traffic bound",
           ratio(t("memory_bound", "psum", 2, 64 * MIB), t("namedax", "psum", 2, 64 * MIB)), 0.8)
    target("device psum N=2 4 B: OpenMPI 4-byte MPI_Allreduce time / namedax time",
           ratio(best_mpi("psum", 2, 4), t("namedax", "psum", 2, 4)), 1.0, note="the faster of plain and hugetlb")
    for n in (4, 16):
        target(f"device psum N={n} 1 MiB: bus bandwidth / OpenMPI MPI_Allreduce np=4",
               ratio(best_mpi("psum", 4, MIB), t("namedax", "psum", n, MIB)), 2.0, note="the faster of plain and hugetlb")
    target("device psum N=16 4 B: namedax time / one std::barrier round among 16 threads",
           ratio(t("namedax", "psum", 16, 4), t("barrier", "barrier", 16, 0)), 1.5, at_most=True)
    for c in ("all_gather", "psum_scatter", "all_to_all", "ppermute"):
        for n in (2, 4):
            for b in (MIB, 16 * MIB):
                target(f"device {c} N={n} {human(b)}: bus bandwidth / OpenMPI {MPI_NAMES[c]} np={n}",
                       ratio(best_mpi(c, n, b), t("namedax", c, n, b)), 1.5, note="the faster of plain and hugetlb")
    # PyTorch's gloo collectives (torch.distributed, one process per rank): namedax must be faster.
    for c in DEVICE_COLLECTIVES:
        for n in (2, 4):
            for b in (4, MIB, 16 * MIB):
                target(f"device {c} N={n} {human(b)}: gloo {TORCH_NAMES[c]} time / namedax time",
                       ratio(t("gloo", c, n, b), t("namedax", c, n, b)), 1.0,
                       note="gloo has no reduce_scatter in PyTorch 1.13" if c == "psum_scatter" else "")
    for c in ("vmap_psum_first", "vmap_psum_last", "vmap_pmax_first", "vmap_pmax_last"):
        r = next((x for x in rows if x["collective"] == c and x["impl"] == "namedax"), None)
        n, b = (r["devices"], r["bytes"]) if r else (0, 0)
        target(f"{c} {human(b)} float32: hand loop time / namedax time",
               ratio(t("hand_loop", c, n, b), t("namedax", c, n, b)), 0.9)
        target(f"{c} {human(b)} float32: xtensor reducer time / namedax time",
               ratio(t("xtensor", c, n, b), t("namedax", c, n, b)), 3.0)
    for c in ("vmap_normalize_first", "vmap_normalize_last"):
        r = next((x for x in rows if x["collective"] == c and x["impl"] == "namedax"), None)
        n, b = (r["devices"], r["bytes"]) if r else (0, 0)
        target(f"{c} x / psum(x) {human(b)}: hand two-pass loop time / namedax time",
               ratio(t("hand_loop", c, n, b), t("namedax", c, n, b)), 0.8)
    r = next((x for x in rows if x["collective"] == "vmap_all_to_all" and x["impl"] == "namedax"), None)
    n, b = (r["devices"], r["bytes"]) if r else (0, 0)
    target(f"vmap_all_to_all {human(b)}: hand block copies time / namedax time",
           ratio(t("hand_loop", "vmap_all_to_all", n, b), t("namedax", "vmap_all_to_all", n, b)), 0.8)
    # The same three with the output preallocated by the caller (map.into(out)), as the hand
    # loop's is.
    for c in ("vmap_normalize_first", "vmap_normalize_last", "vmap_all_to_all"):
        r = next((x for x in rows if x["collective"] == c and x["impl"] == "namedax_into"), None)
        n, b = (r["devices"], r["bytes"]) if r else (0, 0)
        target(f"{c} {human(b)} into a preallocated output: hand loop time / namedax time",
               ratio(t("hand_loop", c, n, b), t("namedax_into", c, n, b)), 0.8)
    # One training step (training_step.cpp) against PyTorch's eager mode at the same thread
    # count (torch_training_step.py): the mesh's 4 device threads against 4 PyTorch threads,
    # the vectorized mesh on one thread against one.
    for step in ("mlp_step", "transformer_step"):
        for mine, theirs, what in (("namedax_devices", "torch_eager_4t", "on 4 device threads / PyTorch eager, 4 threads"),
                                   ("namedax_vectorized_1t", "torch_eager_1t", "vectorized, 1 thread / PyTorch eager, 1 thread")):
            target(f"{step} (forward, grad, SGD) 2 x 2 mesh {what}: PyTorch time / namedax time",
                   ratio(t(theirs, step, 4, training_bytes(step)), t(mine, step, 4, training_bytes(step))), 1.0)
    targets.append({"target": "a second call of the same device collective performs no heap allocation",
                    "ratio": None, "threshold": None, "comparison": "",
                    "status": "met (asserted by tests/test_memory.cpp: 0 allocations per call)", "note": ""})

    print("\n== targets (same-run ratios; noisy machine, see docs/performance.md) ==")
    for x in targets:
        value = f"{x['ratio']:.2f}" if x["ratio"] is not None else "-"
        bound = f"{x['comparison']} {x['threshold']}" if x["threshold"] is not None else ""
        print(f"{x['target']:<92} {value:>8} {bound:>7}  {x['status']}")
    met = sum(x["status"] == "met" for x in targets)
    missed = sum(x["status"] == "missed" for x in targets)
    print(f"{met} met, {missed} missed, {len(targets) - met - missed} other")

    fields = ["impl", "collective", "devices", "bytes", "actual_bytes", "seconds", "bus_GBps"]
    with open(os.path.join(out_dir, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "seconds": f"{r['seconds']:.9g}", "bus_GBps": f"{r['bus_GBps']:.6g}"})
    with open(os.path.join(out_dir, "targets.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["target", "ratio", "comparison", "threshold", "status", "note"])
        w.writeheader()
        for x in targets:
            w.writerow({**x, "ratio": "" if x["ratio"] is None else f"{x['ratio']:.3f}"})
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"targets": targets, "met": met, "missed": missed, "measurements": len(rows)}, f, indent=1)
    print(f"wrote {out_dir}/bench.csv, targets.csv, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
