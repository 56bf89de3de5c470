"""Turns the merged results into the markdown table that `benchmarks.run`
prints (and that the README's performance section pastes)."""

from __future__ import annotations

from typing import Any, Optional

ARM_TITLES = [
    ("none_b", "A/A (noise)"),
    ("noop", "no-op async hook"),
    ("reads", "raw-read async hook"),
    ("memwatch", "MemWatch()"),
    ("memwatch_n10", "MemWatch(every_n_batches=10)"),
    ("sync", "sync callback"),
    ("nvidia_smi", "nvidia-smi"),
    ("memory_stats", "memory_stats()"),
    ("stormlog", "Stormlog"),
]

TARGETS = {
    "overhead_cpu": 1.03,
    "overhead_gpu_mlp": 1.02,
    "hook_ratio": 1.5,
    "bytes_per_row": 100,
    "to_dataframe_s": 1.0,
    "detector_us": 5.0,
}


def _ratio(s: Optional[dict]) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.3f} [{s['min']:.2f}-{s['max']:.2f}]"


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _short(text: Any, n: int = 300) -> str:
    """An error message that fits in a table cell."""
    text = " ".join(str(text).replace("|", "/").split())
    return text if len(text) <= n else text[:n] + " ..."


def _device(entry: dict) -> str:
    if entry.get("gpu"):
        return f"GPU ({entry.get('device')})"
    return "CPU"


def _machine(m: dict) -> list[str]:
    v = m.get("versions", {})
    fw = ", ".join(f"{k} {v[k]}" for k in (
        "keras", "tensorflow", "tensorflow-cpu", "jax", "jaxlib", "torch",
        "nvidia-ml-py", "stormlog", "pandas", "numpy") if k in v)
    gpus = "; ".join(m.get("gpus") or []) or "none"
    return [
        f"- date: {m['date']}" + (f" (git {m['git']})" if m.get("git") else ""),
        f"- machine: {m['cpu']}, {m['cores']} cores (load average at start "
        f"{m.get('load_avg')}), {m['os']}; GPU: {gpus}",
        f"- python {m['python']}; {fw}",
    ]


def _header(results: dict) -> list[str]:
    lines = ["## keras_memwatch benchmarks", ""]
    for m in results.get("machines") or [results["machine"]]:
        lines += _machine(m)
    for command in results.get("commands") or [results["command"]]:
        lines.append(f"- command: `{command}`")
    if results.get("threads"):
        lines.append(f"- compute threads per framework: {results['threads']} "
                     "(`--threads`)")
    if results.get("quick"):
        lines.append("- **--quick: tiny sizes to check that the suite runs; "
                     "these figures mean nothing**")
    return lines


def _overhead(results: dict) -> list[str]:
    rows = []
    for backend, e in results["backends"].items():
        if e.get("status") == "error" and "overhead" not in e:
            rows.append(f"| {backend} | error (see Errors) |")
            continue
        for model, o in (e.get("overhead") or {}).items():
            arms = o["arms"]
            base = arms["none"]["step_ms"]["median"]
            cells = [_ratio(arms.get(a, {}).get("ratio")) if a in arms else "n/a"
                     for a, _ in ARM_TITLES]
            rows.append(
                f"| {backend} | {_device(e)} | {o['workload']} | {base:.2f} | "
                + " | ".join(cells) + " |")
    if not rows:
        return []
    first = next(iter(results["backends"].values()))
    o = next(iter((first.get("overhead") or {"": {}}).values()), {})
    lines = [
        "",
        "### Overhead on training",
        "",
        "Step time with the arm's callback / step time without any, same "
        "process, same model and data; each round runs every arm once "
        "(rotating order) and the ratio is taken within the round. Median "
        "[min-max] over rounds. A fit's step time is the median of its "
        "epochs 2..N over their steps "
        f"(here {o.get('rounds', '?')} rounds, {o.get('epochs', '?')} epochs of "
        f"{o.get('steps_per_epoch', '?')} steps per fit, on the first backend; "
        "nvidia-smi in the first 3 rounds only).",
        "",
        "| backend | device | model | step ms (no callback) | "
        + " | ".join(t for _, t in ARM_TITLES) + " |",
        "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in ARM_TITLES) + " |",
        *rows,
    ]
    skipped = {}
    for backend, e in results["backends"].items():
        for arm, why in (e.get("skipped_arms") or {}).items():
            skipped.setdefault(f"{arm}: {why}", []).append(backend)
    if skipped:
        lines.append("")
        lines.append("n/a: " + "; ".join(
            f"{k} ({', '.join(v)})" for k, v in skipped.items()))
    return lines


def _cpu(results: dict) -> list[str]:
    """CPU time per step of every arm (training thread, whole process)."""
    from benchmarks.arms import ABLATIONS

    titles = dict(ARM_TITLES, none="no callback",
                  **{a: f"{a} ({why})" for a, why in ABLATIONS.items()})
    lines = []
    for backend, e in results["backends"].items():
        for model, o in (e.get("overhead") or {}).items():
            arms = o["arms"]
            if "process_cpu_us" not in arms.get("none", {}):
                continue
            lines += ["", f"{backend}, {_device(e)}, {model}: medians over rounds", "",
                      "| arm | step ratio | step ms | training thread CPU us/step "
                      "| process CPU us/step |", "| --- | ---: | ---: | ---: | ---: |"]
            for arm, a in arms.items():
                lines.append(
                    f"| {titles.get(arm, arm)} | {_ratio(a['ratio'])} | "
                    f"{a['step_ms']['median']:.3f} | "
                    f"{a['train_thread_cpu_us']['median']:.1f} | "
                    f"{a['process_cpu_us']['median']:.1f} |")
    if lines:
        lines = ["", "### CPU time per step, per arm", "",
                 "Over whole fits (all epochs): the training thread's CPU time "
                 "and the whole process's, per step."] + lines
    return lines


def _hook(results: dict) -> list[str]:
    rows, probe_rows, profile_rows = [], [], []
    for backend, e in results["backends"].items():
        h = e.get("hook")
        if not h:
            continue
        p = h.get("profile_us")
        if p:
            profile_rows.append(
                f"| {backend} | {_device(e)} | {p['begin_hook']:.1f} | "
                f"{p['end_hook']:.1f} | {p['probe_reads']:.1f} | "
                f"{p['sampler_guard']:.1f} | {p['logs_figures']:.1f} | "
                f"{p['hand_over_and_checks']:.1f} | "
                f"{_num(p.get('end_hook_uninstrumented'))} | "
                f"{_num(p.get('instrumentation'))} |")
        rows.append(
            f"| {backend} | {_device(e)} | {', '.join(h['probes'])} | "
            f"{h['minimal_us']:.1f} | {h['memwatch_begin_us']:.1f} + "
            f"{h['memwatch_end_us']:.1f} = {h['memwatch_us']:.1f} | "
            f"**{h['ratio']:.2f}** ({h['ratio_mean']:.2f} on means) | "
            f"{_num(h.get('minimal_called_us'))} | {_num(h.get('ratio_called'), '{:.2f}')} | "
            f"{h['memwatch_own_us']:.1f} |")
        for name, p in h["per_probe"].items():
            probe_rows.append(
                f"| {backend} | {name} | {_num(p['hot_loop_us'], '{:.2f}')} | "
                f"{_num(p['in_minimal_us']['median'])} | "
                f"{_num(p['in_memwatch_us']['median'])} |")
    if not rows:
        return []
    return [
        "",
        "### Batch hook CPU time (us per batch)",
        "",
        "Thread CPU time (`time.thread_time_ns`) of MemWatch's batch hooks "
        "(begin, on the training thread + end, on a Keras worker thread under "
        "JAX and PyTorch) against a minimal async-safe hook that only calls the "
        "same probes' `read()`, both in the same fit of the MLP; medians over "
        "batches of epochs 2..N, each hook first in half of the rounds; timer "
        "cost subtracted. The minimal hook is timed inside its body; 'timed "
        "as MemWatch' times its begin (a no-op) and end hooks as MemWatch's "
        "are, around calls into the callback's methods, which the in-body "
        "figure leaves out. 'own work' is MemWatch minus its probes' reads "
        "(spike detection, recording, ordering, logs).",
        "",
        "| backend | device | probes | minimal hook | MemWatch (begin + end) | "
        "ratio (target <= 1.5) | minimal hook timed as MemWatch | ratio so | "
        "MemWatch own work |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Per probe, us per `read()`: in a hot loop outside `fit`, inside the "
        "minimal hook, inside MemWatch.",
        "",
        "| backend | probe | hot loop | in minimal hook | in MemWatch |",
        "| --- | --- | ---: | ---: | ---: |",
        *probe_rows,
    ] + ([
        "",
        "Where MemWatch's hook time goes (us per batch; means over batches of "
        "the instrumented fits, epochs 2..N, median over rounds; nested timers "
        "subtracted): the batch-end hook is the probes' own `read()`, the "
        "sampler's guard around them (failure counts, intervals, the slow-read "
        "check), the figures for Keras's logs, and the rest: the checks, the "
        "batch's key, the lock and the hand-over to the pipeline. The wrappers "
        "that time the parts cost something themselves, mostly counted in the "
        "guard and the hand-over: the last two columns give the end hook "
        "without them and the difference.",
        "",
        "| backend | device | begin hook | end hook | probe reads | sampler "
        "guard | logs figures | hand-over and checks | end hook, not "
        "instrumented | instrumentation |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *profile_rows,
    ] if profile_rows else [])


def _scenario(results: dict) -> str:
    seen: dict[str, str] = {}
    for e in results["backends"].values():
        s = e.get("spikes")
        if s:
            where = "GPU" if e.get("gpu") else "CPU"
            seen.setdefault(f"{s['scenario']} ({len(s['oversized'])} oversized)",
                            where)
    if not seen:
        return "The spike scenario"
    if len(seen) == 1:
        return next(iter(seen))
    return "; ".join(f"{where}: {text}" for text, where in seen.items())


def _spikes(results: dict) -> list[str]:
    rows = []
    for backend, e in results["backends"].items():
        s = e.get("spikes")
        if not s:
            if e.get("spikes_error"):
                rows.append(f"| {backend} | | error: {_short(e['spikes_error'], 120)} | | | | |")
            continue
        n = len(s["oversized"])
        for t in s["tools"]:
            if "skipped" in t or "error" in t:
                rows.append(f"| {backend} | {_device(e)} | {t['tool']}: "
                            f"{t.get('skipped') or t.get('error')} | | | | |")
                continue
            rows.append(
                f"| {backend} | {_device(e)} | {t['tool']} | {len(t['caught'])}/{n} | "
                f"{len(t['tied'])}/{n} | {len(t['false_alarms'])} | {t['samples']} |")
    if not rows:
        return []
    return [
        "",
        "### Spike scenario: who catches the oversized batches",
        "",
        f"{_scenario(results)}. 'caught': flagged during the "
        "oversized batch (MemWatch: a spike event; Stormlog: a sample taken "
        "during that batch that rose >= 64 MiB, mapped to the batch by the "
        "benchmark's clock); 'named': the tool itself says which batch.",
        "",
        "| backend | device | tool | caught | named | false alarms | samples |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def _scale(results: dict) -> list[str]:
    sc = results.get("scale") or {}
    if sc.get("status") == "error":
        return ["", "### Scale", "", f"error: {_short(sc.get('error'))}"]
    s = sc.get("scale")
    if not s:
        return []
    rows = []
    for m in s["memory"]:
        rows.append(f"| memory per row, {m['device']} | "
                    f"{m['allocated_bytes_per_row']:.1f} B | <= 100 B |")
    ring = s["ring"]
    ring_mib = sum(m["allocated_mib"] for m in ring["memory"])
    all_mib = sum(m["allocated_mib"] for m in s["memory"])
    rows.append(f"| record of {s['samples']:,} samples, 2 devices | {all_mib:.1f} MiB "
                "(linear) | |")
    rows.append(f"| ring `max_rows={ring['max_rows']:,}` after {s['samples']:,} samples | "
                f"{ring_mib:.1f} MiB (bounded) | |")
    rows.append(f"| `Recorder.extend`, blocks of 128 | "
                f"{s['append_us_per_sample']:.2f} us/sample | |")
    fh = s["to_dataframe_host_only"]
    f2 = s["to_dataframe_host_and_gpu"]
    rows.append(f"| `to_dataframe()`, {fh['rows']:,} rows (host) | "
                f"{fh['s']['median']:.3f} s (min {fh['s']['min']:.3f}) | < 1 s |")
    rows.append(f"| `to_dataframe()`, {f2['rows']:,} rows (host + GPU) | "
                f"{f2['s']['median']:.3f} s; {f2['frame_bytes_per_row']:.0f} B/row "
                "in the DataFrame | |")
    c = s["csv"]
    rows.append(f"| streamed CSV log | {c['rows_per_s']:,.0f} rows/s "
                f"({c['us_per_sample']:.1f} us/sample of 2 rows, "
                f"{c['bytes_per_row']:.0f} B/row on disk) | |")
    p = s.get("pipeline")
    if p:
        rows.append(f"| the pipeline's whole work, blocks of {p['block']} (JAX-like "
                    f"GPU, host, NVML) | {p['us_per_sample']:.1f} us/sample, "
                    f"{p['streamed_us_per_sample']:.1f} with the streamed log | |")
    for k, d in s["detector"].items():
        target = " < 5 us |" if k == "window=1000" else " |"
        rows.append(f"| `SpikeDetector.update`, {k} | {d['us_per_update']:.2f} us |"
                    + target)
    return [
        "",
        f"### Scale ({s['samples']:,} samples)",
        "",
        "| figure | measured | target |",
        "| --- | --- | --- |",
        *rows,
        "",
        f"Growth: {s['growth']}.",
    ]


def targets(results: dict) -> list[dict[str, Any]]:
    """Each target with its figure and verdict."""
    out = []
    for backend, e in results["backends"].items():
        for model, o in (e.get("overhead") or {}).items():
            if e.get("gpu") and model != "mlp":
                continue
            limit = TARGETS["overhead_gpu_mlp" if e.get("gpu") else "overhead_cpu"]
            r = o["arms"]["memwatch"]["ratio"]
            aa = o["arms"].get("none_b", {}).get("ratio")
            note = f"A/A {_ratio(aa)}" if aa else ""
            # When no callback against itself spreads wider than the distance
            # from the figure to the target, the verdict says so.
            noisy = bool(aa and aa.get("max") is not None
                         and (aa["max"] - aa["min"]) / 2 > abs(r["median"] - limit))
            if noisy:
                note += ": the noise is wider than the gap to the target"
            out.append({"target": f"overhead <= {limit}",
                        "where": f"{backend} {_device(e)} {model}",
                        "figure": r["median"], "met": r["median"] <= limit,
                        "noisy": noisy, "note": note})
            if e.get("gpu"):
                # Issue 14's: against the arm doing the same reads (JAX) or
                # Keras's own dispatch of a callback (PyTorch), round by round.
                floor = "reads" if backend == "jax" else "noop"
                paired = _paired(o["arms"], "memwatch", floor)
                if paired is not None:
                    out.append({"target": f"MemWatch / {floor} arm <= 1.02",
                                "where": f"{backend} {_device(e)} {model}",
                                "figure": paired, "met": paired <= 1.02,
                                "note": "median over rounds of the ratio "
                                        "within each round"})
        h = e.get("hook")
        if h:
            out.append({"target": "hook <= 1.5x minimal",
                        "where": f"{backend} {_device(e)}",
                        "figure": h["ratio"], "met": h["ratio"] <= 1.5,
                        "note": f"{h['memwatch_us']:.1f} us vs {h['minimal_us']:.1f} us"})
    s = (results.get("scale") or {}).get("scale")
    if s:
        for m in s["memory"]:
            out.append({"target": "<= 100 B/row/device", "where": m["device"],
                        "figure": m["allocated_bytes_per_row"],
                        "met": m["allocated_bytes_per_row"] <= 100, "note": ""})
        fh = s["to_dataframe_host_only"]
        out.append({"target": "to_dataframe 1M rows < 1 s",
                    "where": f"{fh['rows']:,} rows",
                    "figure": fh["s"]["median"], "met": fh["s"]["median"] < 1.0,
                    "note": "" if fh["rows"] >= 1_000_000 else "fewer rows than the target's"})
        d = s["detector"]["window=1000"]["us_per_update"]
        out.append({"target": "detector update < 5 us", "where": "window=1000",
                    "figure": d, "met": d < 5.0, "note": ""})
    return out


def _paired(arms: dict, arm: str, floor: str) -> Optional[float]:
    """The median over rounds of `arm`'s step time over `floor`'s."""
    import statistics

    a, b = arms.get(arm, {}).get("ratios"), arms.get(floor, {}).get("ratios")
    if not a or not b or len(a) != len(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b))


def _verdict(x: dict) -> str:
    word = "met" if x["met"] else "**missed**"
    return f"{word}?" if x.get("noisy") else word


def _targets(results: dict) -> list[str]:
    t = targets(results)
    results["targets"] = t
    if not t:
        return []
    return [
        "",
        "### Targets",
        "",
        "| target | where | measured | verdict |",
        "| --- | --- | ---: | --- |",
        *(f"| {x['target']} | {x['where']} | {x['figure']:.3f} | "
          f"{_verdict(x)}{'; ' + x['note'] if x['note'] else ''} |"
          for x in t),
    ]


def render(results: dict) -> str:
    lines = _header(results)
    for section in (_overhead, _cpu, _hook, _spikes, _scale, _targets):
        lines += section(results)
    errors = [f"- {b}: {_short(e.get('error'))}" for b, e in results["backends"].items()
              if e.get("status") == "error"]
    if errors:
        lines += ["", "### Errors", "", *errors]
    return "\n".join(lines) + "\n"
