"""Runs the whole benchmark suite and prints one table (markdown).

    python -m benchmarks.run [--backend jax[,torch]] [--quick]
        [--json out.json] [--only overhead,hook,scale,peers,ablation]
        [--models mlp,convnet]

Parts:
  overhead  step time of `fit` with `MemWatch()` over step time without it,
            alternated in one process, per backend and model, with the A/A
            (no callback against itself) noise floor.
  peers     the same ratio for the ways people watch memory today (a plain
            synchronous callback, nvidia-smi per batch, torch.cuda.memory_stats()
            per batch, Stormlog's timer-thread tracker), and detection of the
            oversized batches of the spike scenario by MemWatch and Stormlog.
  hook      thread CPU time of MemWatch's batch hooks against a minimal
            async-safe hook doing the same probe reads in the same fit, and
            per probe.
  ablation  the overhead part with MemWatch arms that each lack one part
            (benchmarks.arms.ABLATIONS), to find where its cost goes.
  scale     1,000,000 samples: recorder memory per row, to_dataframe() time,
            streamed CSV throughput, detector update cost.

The Keras backend is fixed per process, so each backend's parts run in a
child process (`benchmarks.child`); the spike scenario gets a fresh one.
Backends default to every one installed (tensorflow, jax, torch). Machine,
versions and date are printed with the results, and everything goes to the
JSON file (default out/benchmarks.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import log, machine_info
from benchmarks.report import render

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("overhead", "peers", "hook", "scale", "ablation")
BACKENDS = ("tensorflow", "jax", "torch")


def installed_backends() -> list[str]:
    return [b for b in BACKENDS if importlib.util.find_spec(b) is not None]


def run_child(parts: list[str], backend: str, args: argparse.Namespace,
              extra_env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if args.threads:
        n = str(args.threads)
        env.update(BENCH_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n,
                   TF_NUM_INTRAOP_THREADS=n)
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        cmd = [sys.executable, "-m", "benchmarks.child", "--parts", ",".join(parts),
               "--models", args.models, "--out", out,
               "--overrides", json.dumps(args.overrides or {})]
        if args.quick:
            cmd.append("--quick")
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, cwd=str(ROOT), timeout=args.timeout,
                                  stdout=sys.stderr if args.verbose else subprocess.PIPE,
                                  stderr=sys.stderr if args.verbose else subprocess.PIPE,
                                  text=True)
        except subprocess.TimeoutExpired:
            return {"status": "error", "error": f"timed out after {args.timeout} s"}
        if os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
        else:
            tail = (proc.stderr or "").strip().splitlines()[-8:]
            result = {"status": "error",
                      "error": f"exit {proc.returncode}: " + " | ".join(tail)}
        result["wall_s"] = round(time.perf_counter() - t, 1)
        return result


def merge(paths: list[str]) -> dict[str, Any]:
    """One result from several runs; backends are keyed `jax/cpu`, `jax/gpu`."""
    merged: dict[str, Any] = {"machines": [], "commands": [], "backends": {},
                              "quick": False, "threads": None}
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        merged["machines"].append(r["machine"])
        merged["commands"].append(r["command"])
        merged["quick"] = merged["quick"] or r.get("quick", False)
        if r.get("threads"):
            merged["threads"] = r["threads"]
        for backend, entry in r["backends"].items():
            key = backend.split("/")[0] + ("/gpu" if entry.get("gpu") else "/cpu")
            merged["backends"][key] = entry
        if r.get("scale") and "scale" not in merged:
            merged["scale"] = r["scale"]
    merged["machine"] = merged["machines"][0]
    merged["command"] = "; ".join(merged["commands"])
    return merged


def _write(path: Optional[str], results: dict[str, Any]) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="comma list among tensorflow,jax,torch "
                        "(default: every one installed)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: checks that everything runs, "
                             "figures mean nothing")
    parser.add_argument("--json", default=str(ROOT / "out" / "benchmarks.json"),
                        help="write all results here (default out/benchmarks.json)")
    parser.add_argument("--only", help=f"comma list among {','.join(PARTS)}")
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="seconds allowed per child process")
    parser.add_argument("--overrides", type=json.loads, default=None,
                        help='sizes, as JSON: {"overhead": {"reps": 9}}; '
                             '"arms": [...] in "overhead" runs only those arms '
                             '(and no callback)')
    parser.add_argument("--threads", type=int, default=None,
                        help="compute threads per framework (OMP, MKL, "
                             "TensorFlow intra-op, torch.set_num_threads); "
                             "default: the frameworks' own. On a shared "
                             "machine PyTorch's spinning OpenMP threads can "
                             "slow a step 30x: --threads 1 avoids it")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: merge result files of earlier runs "
                             "(say the CPU here and the GPU there) into one table")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the children's progress and warnings")
    args = parser.parse_args(argv)
    if args.merge:
        results = merge(args.merge)
        print(render(results))
        if args.json and args.json != parser.get_default("json"):
            _write(args.json, results)
        return 0

    parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose among {list(PARTS)}")
    backends = ([b.strip() for b in args.backend.split(",") if b.strip()]
                if args.backend else installed_backends())
    bad = sorted(set(backends) - set(BACKENDS))
    if bad:
        parser.error(f"unknown backends {bad}; choose among {list(BACKENDS)}")

    results: dict[str, Any] = {
        "machine": machine_info(),
        "command": "python -m benchmarks.run " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "quick": args.quick,
        "threads": args.threads,
        "parts": parts,
        "backends": {},
    }
    log(f"benchmarks: parts {parts}, backends {backends}"
        f"{' (quick)' if args.quick else ''}")
    if "scale" in parts:
        log("scale ...")
        results["scale"] = run_child(["scale"], backends[0] if backends else "jax", args)
    fit_parts = [p for p in ("overhead", "peers", "hook", "ablation") if p in parts]
    for backend in backends:
        entry: dict[str, Any] = {}
        if fit_parts:
            log(f"{backend}: {fit_parts} ...")
            entry = run_child(fit_parts, backend, args)
        if "peers" in parts:
            log(f"{backend}: spike scenario ...")
            # A fresh process: the scenario judges host RSS too, which a
            # process that has trained for minutes no longer gives back.
            # oneDNN keeps freed memory in TensorFlow: off, as in the tests.
            spikes = run_child(["spikes"], backend, args,
                               {"TF_ENABLE_ONEDNN_OPTS": "0"})
            if spikes.get("status") == "ok":
                entry["spikes"] = spikes["spikes"]
                entry.setdefault("gpu", spikes.get("gpu"))
                entry.setdefault("device", spikes.get("device"))
                entry.setdefault("status", "ok")
            else:
                entry["spikes_error"] = spikes.get("error")
        results["backends"][backend] = entry
        _write(args.json, results)  # partial results survive a later crash

    text = render(results)
    print(text)
    if args.json:
        _write(args.json, results)
        log(f"results written to {args.json}")
    failed = [b for b, e in results["backends"].items() if e.get("status") == "error"]
    if results.get("scale", {}).get("status") == "error":
        failed.append("scale")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
