"""Human-readable rendering of a diagnose report (the JSON dict of ``pipeline.diagnose``), and reading a saved one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import ConfigError

#: keys every report of ``pipeline.diagnose`` has; a JSON object without them is some other file.
REPORT_KEYS = ("n_tokens", "ess_frac", "by_age", "config")

#: report key -> label of the summary table's rows
ROWS = {"ess_frac": "ESS fraction (Kish)", "chi2": "chi^2 = mean r^2 - 1", "d2": "D_2 = log mean r^2",
        "kl_k1": "KL k1 = mean(-log r)", "kl_k2": "KL k2 = mean((log r)^2)/2", "kl_k3": "KL k3 = mean(r - 1 - log r)",
        "m2": "M2 = mean((log r)^2)", "ratio_min": "ratio min", "ratio_mean": "ratio mean", "ratio_max": "ratio max"}
#: metric key prefix -> where its definition comes from (framework_stats.py transcribes it)
FRAMEWORK_SOURCES = {"rollout_corr/": "verl rollout_corr_helper.py",
                     "actor/": "verl core_algos.py (vanilla PPO, dual clip)",
                     "sampling/": "TRL grpo_trainer.py (vLLM IS, sequence_mask)",
                     "clip_ratio/": "TRL grpo_trainer.py compute_loss", "m2po/": "M2PO core_algos.py"}


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, (list, tuple)):  # a correction with two params, e.g. ppo_clip_asym lo/hi
        return "/".join(_fmt(v, digits) for v in x)
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x) if isinstance(x, float) and not math.isfinite(x) else f"{x:.{digits}g}"


def load_report(path: str | os.PathLike) -> dict:
    """A report saved by ``replay-theory diagnose LOG --save PATH``; one-line :class:`ConfigError` otherwise."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8-sig"))  # a byte-order mark is accepted
    except OSError as err:
        raise ConfigError("report", f"{path} cannot be read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError("report", f"{path} is not a diagnose report: it is not text") from None
    except json.JSONDecodeError as err:
        raise ConfigError("report", f"{path} is not a diagnose report: not JSON ({err.msg}, line {err.lineno} "
                                    f"column {err.colno})") from None
    missing = [k for k in REPORT_KEYS if not isinstance(report, dict) or k not in report]
    if missing:
        raise ConfigError("report", f"{path} is not a diagnose report (no {', '.join(missing)}); save one with "
                                    "replay-theory diagnose LOG --save REPORT.json")
    return report


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  " + "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                          for i, (c, w) in enumerate(zip(cells, widths)))
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _header(report: dict) -> list[str]:
    """The file line, the token / sequence counts, a sampling warning and the skipped counts."""
    out = [f"replay-theory diagnose: {report['file']} ({report['format']}, {report['layout']} layout, "
           f"preset {report['preset']})",
           f"  {report['n_tokens']:,} tokens in {report['n_sequences']:,} sequences; r = pi_current / pi_behav"]
    if report.get("sample_note"):
        out.append(f"  WARNING: {report['sample_note']}")
    skipped = {k: v for k, v in (report.get("skipped") or {}).items() if v}
    return out + ["  skipped: " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) if skipped else "none"), ""]


def _quantile_lines(report: dict) -> list[str]:
    """The ratio quantiles line (none when the report has no quantiles)."""
    q = report.get("ratio_quantiles") or {}
    if not q:
        return []
    error = report.get("ratio_quantiles_log_error")
    # printed only when a quantile came from a coarsened tail bin: the default 1e-3 is below the 3 digits shown
    within = f" (each within a factor e^{error:.3g} = {math.exp(error):.4g})" if error and error > 2e-3 else ""
    logs = report.get("log_ratio_quantiles") or {}
    # a quantile that leaves float64 (null: over; 0: under) is shown as e^{log r}, never as a bare "-" or 0
    shown = {k: f"e^{logs[k]:.4g}" if (v is None or v == 0) and logs.get(k) is not None else _fmt(v, 3)
             for k, v in q.items()}
    return [f"  ratio quantiles{within}: " + "  ".join(f"{k} {v}" for k, v in shown.items())]


def _summary_lines(report: dict) -> list[str]:
    """The token / sequence summary table and the ratio quantiles."""
    seq = report.get("sequence") or {}
    out = _table(["statistic", "token", "sequence"],
                 [[label, _fmt(report.get(key)), _fmt(seq.get(key))] for key, label in ROWS.items()])
    return out + _quantile_lines(report)


def _bounds_lines(report: dict) -> list[str]:
    """The theory bounds table, token level then sequence level."""
    rows = [[f"{level}: {rel['name']}", _fmt(rel["lhs"]), _fmt(rel["rhs"]), _fmt(rel["holds"]), _fmt(rel["slack"]),
             rel["source"]] for level in ("token", "sequence") for rel in (report.get("bounds") or {}).get(level, [])]
    return ["", "theory bounds (lhs <= rhs):"] + _table(["relation", "lhs", "rhs", "holds", "slack", "source"], rows)


def _age_label(b: dict) -> str:
    """One age bin's label: its age, or its age range."""
    return f"{b['age_min']:g}" if b["age_min"] == b["age_max"] else f"{b['age_min']:g}-{b['age_max']:g}"


def _age_lines(report: dict) -> list[str]:
    """The by-sample-age table (none when the report has no age bins)."""
    if not report.get("by_age"):
        return []
    rows = [[_age_label(b), _fmt(b["n_tokens"]), _fmt(b["ess_frac"]), _fmt(b["ess_bound"]), _fmt(b["chi2"]),
             _fmt(b["kl_k3"]), _fmt(b["m2"]), _fmt(b["ratio_max"])] for b in report["by_age"]]
    return ["", "by sample age:"] + _table(["age", "tokens", "ess_frac", "<= e^-KL", "chi2", "kl_k3", "m2",
                                            "ratio_max"], rows)


def _drift_lines(report: dict) -> list[str]:
    """The KL drift line: the fitted rate, or why none was fitted (none when the report has no drift)."""
    drift = report.get("drift")
    if not drift:
        return []
    if "rate_per_step" not in drift:
        return ["", f"KL drift: {drift.get('reason', 'not fitted')}"]
    exp_text = "-" if drift["exponent"] is None else f"{drift['exponent']:.2f}"
    return ["", f"KL drift: {drift['rate_per_step']:.4g} per step of age (floor {drift['floor']:.3g}), "
                f"looks {drift['shape']} (log-log exponent {exp_text}); FreshPER tau = 1/c = "
                f"{_fmt(drift['tau'])}"]


def _framework_source(key: str) -> str:
    """Where a framework metric's definition comes from, by its key's prefix ("" when unknown)."""
    return next((src for prefix, src in FRAMEWORK_SOURCES.items() if key.startswith(prefix)), "")


def _framework_lines(report: dict) -> list[str]:
    """The framework metrics table (none when the report has no framework metrics)."""
    framework = report.get("framework") or {}
    if not framework:
        return []
    seq_is = report.get("framework_rollout_is_sequence") or {}
    params = report.get("framework_params") or {}
    out = ["", "framework metrics (TRL / verl / M2PO keys as their code logs them; "
               + ", ".join(f"{k} {v:g}" for k, v in params.items()) + "):"]
    rows = [[key, _fmt(value), _fmt(seq_is.get(key)) if key in seq_is else "", _framework_source(key)]
            for key, value in framework.items()]
    return out + _table(["metric", "value", "rollout_is=sequence", "source"], rows)


def _what_if_note(r: dict) -> str:
    """A what-if row's note: its own, else its M2 when it has one."""
    return r.get("note") or (f"M2 = {_fmt(r['m2'])} (m2po/M2)" if "m2" in r else "")


def _what_if_lines(report: dict) -> list[str]:
    """The what-if table (none when the report has no what-if rows)."""
    if not report.get("what_if"):
        return []
    rows = [[r["correction"], r["level"], "-" if r["param"] is None else _fmt(r["param"]),
             _fmt(r["flagged_frac"]), _fmt(r["ess_frac"]), _fmt(r["bias_proxy"]), _what_if_note(r)]
            for r in report["what_if"]]
    return (["", "what if (same tokens, other corrections; w = 0 where a token stops training):"]
            + _table(["correction", "level", "param", "flagged", "ess_frac", "bias_proxy", "note"], rows))


def render(report: dict) -> str:
    """Tables: summary (token / sequence), bounds, by age, drift, what-if."""
    sections = (_header, _summary_lines, _bounds_lines, _age_lines, _drift_lines, _framework_lines, _what_if_lines)
    return "\n".join(line for section in sections for line in section(report))
