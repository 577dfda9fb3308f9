"""The markdown summary of bench/gpu_check.py's result (``gpu_check.md``, also printed): one block per section."""

from __future__ import annotations

import math
from typing import Any, Callable

from gpu_check_plan import SECTIONS, TITLES


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"  # tokens/s: 12,345 not 1.23e+04
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows)]


def _busy(record: dict) -> str:
    busy = record.get("gpu_busy_fraction", "unavailable")
    if not isinstance(busy, float):
        return f"GPU busy: {busy}"
    return f"GPU busy {busy:.2f} of the time ({record.get('gpu_source')}, {record.get('gpu_samples')} samples)"


def _environment_lines(record: dict) -> list[str]:
    if "torch" not in record:
        return []
    keys = ["python", "torch", "torch_cuda", "transformers", "device_name", "total_memory_gib", "capability",
            "driver", "cpu_count", "matmul_allow_tf32", "nvidia_smi", "c_compiler"]
    return _table(["key", "value"], [[k, record.get(k)] for k in keys])


def _validate_all_lines(record: dict) -> list[str]:
    if "wall_s" not in record:
        return []
    return [f"`{record['command']}`", "",
            f"wall {record['wall_s']:.1f} s, exit code {record['exit_code']}; {_busy(record)}; peak GPU "
            f"memory used {_fmt(record.get('gpu_memory_used_max_mib'))} MiB", "", "```",
            *record.get("lines", []), *record.get("verdict_lines", []), "```"]


def _batched_verify_lines(record: dict) -> list[str]:
    if not record.get("runs"):
        return []
    lines = _table(["mode", "seconds", "compile s inside", "peak RSS MiB", "peak GPU MiB",
                    "GPU busy (its clock)", "GPU busy (process)"],
                   [[m, r.get("seconds"), r.get("compile_s"), r.get("peak_rss_mib"), r.get("peak_gpu_mib"),
                     r.get("gpu_busy_fraction_in_clock"), r.get("gpu_busy_fraction")]
                    for m, r in record["runs"].items()])
    return lines + ["", f"{record['seeds']} seeds x 2 designs x {record['steps']} updates + held-out evaluation, "
                    f"tiny model on {record['device']}: ratio sequential / batched "
                    f"{_fmt(record.get('ratio_sequential_over_batched'))}x; held-out results equal seed by seed: "
                    f"{_fmt(record.get('held_out_equal'))} (max |difference| "
                    f"{_fmt(record.get('held_out_max_abs_diff'))})"]


def _mu_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    return [f"R = {record['rollouts']} completions (G = {record['group_size']}), fixed length; "
            f"{record['precision']}; loop: {record.get('loop', '-')}; {_busy(record)}", "",
            *_table(["shape", "L", "micro-batch", "generation s", "sampling s", "update s", "compile s (apart)",
                     "mu", "mu (sampling only)", "peak GiB", "status"],
                    [[c["shape"], c["length"], c.get("micro_batch"), c.get("generation_s"),
                      c.get("sampling_s"), c.get("update_s"), c.get("compile_s"), c.get("mu"),
                      c.get("mu_sampling_only"), c.get("peak_memory_gib"), c["status"]]
                     for c in record["cases"]])]


def _decode_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    lines = [f"{record['shape']}, R = {record['rollouts']}, L = {record['length']} (fixed), "
             f"{record['weights']} weights; {_busy(record)}", ""]
    lines += _table(["variant", "tokens per call", "seconds", "tokens/s", "speed-up vs the old loop", "status"],
                    [[c["variant"], c.get("tokens_per_call"), c.get("seconds"), c.get("tokens_per_s"),
                      c.get("speedup_vs_old_loop"), c.get("status")] for c in record["cases"]])
    for c in (c for c in record["cases"] if "first_call_s" in c):
        lines += ["", f"{c['variant']}: first call {_fmt(c['first_call_s'])} s, steady "
                  f"{_fmt(c.get('seconds'))} s, compile ~ {_fmt(c.get('compile_s'))} s; compiled: "
                  f"{_fmt(c.get('compiled'))}"]
    return lines + ["", f"the validator's loop: {_fmt(record.get('loop_tokens_per_s'))} tokens/s (target >= "
                    f"10,000), {_fmt(record.get('loop_over_compiled_reference'))} of the compiled reference "
                    f"(target >= 0.7)"]


def _verdict_rules_lines(c: dict) -> list[str]:
    """A verdict case's batch, budget and B_noise, each rule's placement, and the designs' held-out rewards."""
    lines = [f"B = {c['batch_size']}, {c['seeds']} seeds (batched: {_fmt(c['batched'])}), budget "
             f"{c['budget_updates']} on-policy updates at mu = {_fmt(c['mu_priced'])} (measured "
             f"{_fmt(c['mu_measured'])}); B_noise = {_fmt(c['b_noise'])} (interval "
             f"{', '.join(_fmt(v) for v in c.get('b_noise_interval') or [])}); measured best: "
             f"{c['measured_best']}", ""]
    lines += _table(["rule", "design", "regime", "b", "kappa", "rank", "P(best)", "regret", "strongest rival",
                     "difference", "se", "seeds for 2 se", "first or within 1 se"],
                    [[r["rule"], r["design"], r["regime"], r["b"], r["kappa"],
                      None if r["rank"] is None else f"{r['rank']} of {r['designs']}", r["p_best"],
                      r["regret"], r["rival"], r["difference"], r["se"], r["seeds_for_2se"],
                      r["first_or_within_one_se"]] for r in c["rules"]])
    if c.get("forgetting_note"):
        lines += ["", f"forgetting-aware rule: no prediction ({c['forgetting_note']})"]
    return lines + [""] + _table(["design", "R", "N", "B", "updates", "held-out reward", "sd"],
                                 [[d["name"], d["rollouts_per_step"], d["capacity"], d["batch_size"], d["steps"],
                                   d["reward_mean"], d["reward_sd"]] for d in c["designs"]])


def _verdict_case_lines(c: dict) -> list[str]:
    lines = [f"### {c['label']}: {c['status']}", ""]
    if "wall_s" not in c:
        return lines
    lines += [f"`{c['command']}`", "", f"wall {c['wall_s']:.1f} s (target <= 360 s; calibration "
              f"{_fmt(c.get('calibration_seconds'))} s, verify {_fmt(c.get('verify_seconds'))} s), "
              f"exit code {c['exit_code']}; {_busy(c)}; peak GPU memory used "
              f"{_fmt(c.get('gpu_memory_used_max_mib'))} MiB", ""]
    if c.get("rules"):
        lines += _verdict_rules_lines(c)
    return lines + [""]


def _verdict_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    lines = [f"--kappa: {_fmt(record.get('kappa_given'))}", ""]
    for c in record["cases"]:
        lines += _verdict_case_lines(c)
    return lines


def _logprob_mismatch_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    return [f"{record['shape']}, R = {record['rollouts']}, L = {record['length']}; bf16 rows: "
            f"{record.get('autocast_bf16', '-')}, fp32 rows: {record.get('autocast_fp32', '-')}", "",
            *_table(["pair", "max abs per token", "mean abs per token", "max abs per sequence", "tokens"],
                    [[c["pair"], c.get("max_abs"), c.get("mean_abs"), c.get("seq_max_abs"), c.get("tokens")]
                     for c in record["cases"]])]


# each section's block under its heading (no lines where the section has no numbers)
SECTION_MARKDOWN: dict[str, Callable[[dict], list[str]]] = {
    "environment": _environment_lines, "validate_all": _validate_all_lines, "batched_verify": _batched_verify_lines,
    "mu": _mu_lines, "decode": _decode_lines, "verdict": _verdict_lines, "logprob_mismatch": _logprob_mismatch_lines}


def markdown(data: dict) -> str:
    """The summary: one block per section in report order, the numbers of gpu_check.json in tables."""
    sections = data["sections"]
    env = sections.get("environment", {})
    lines = ["# GPU check (bench/gpu_check.py)", "",
             f"{'SMOKE (CPU, tiny shapes: code paths, not numbers); ' if data['smoke'] else ''}device "
             f"{env.get('device_name') or data['device']} ({_fmt(env.get('total_memory_gib'))} GiB, capability "
             f"{env.get('capability') or '-'}), torch {env.get('torch', '-')}, transformers "
             f"{env.get('transformers', '-')}; wall {data.get('wall_s', 0):.1f} s of the {data['deadline_s']:.0f} s "
             f"deadline", ""]
    for name in SECTIONS:
        record = sections.get(name, {"status": "skipped: not reached"})
        lines += [f"## {TITLES[name]}: {record['status']} ({_fmt(record.get('seconds'))} s)", ""]
        lines += SECTION_MARKDOWN[name](record)
        lines.append("")
    return "\n".join(lines)
