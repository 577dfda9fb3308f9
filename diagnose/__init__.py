"""``replay-theory diagnose``: off-policy health and what-if analysis of logged rollouts.

Reads a log of behaviour and current log-probs written by TRL, verl or any trainer (``schema.py``), streams it
(``reader.py``) into mergeable log-space sums (``accumulators.py``), and reports the importance-weight quantities of
``theory/divergences.py`` overall, per sequence and per sample age, the theory bounds with their slack
(``theory/bounds.py``), the KL drift with age and the FreshPER tau it implies (``drift.py``), and what other
corrections would have done to the same tokens (``whatif.py``), and the metrics TRL, verl and M2PO log, under their
own keys and with their code's definitions (``framework_stats.py``; ``framework_statistics`` is the numpy-only batch
form the trainers can log).  TRL computes no ESS; ``ess_frac`` here is the Kish fraction of the raw ratios, not
verl's ``rollout_is_eff_sample_size`` (the Kish fraction of the ratios clamped to [1/C, C]), which the framework
section reports separately.  ``pipeline.diagnose`` runs the pass; ``report.py`` renders it.

Papers and symbols: FreshPER (prioritized replay; ``ess_frac`` = ESS/n, its bound e^{-KL(new || behav)} in
Eqs. 10-11, the age decay ``freshper_tau`` = tau of Eq. 13), M2PO (``m2`` = M2 of Eq. 4, ``kl_k1`` of Eq. 3,
Thm 5.1's chi^2 <= R^2 M2), Replay-RLOO (truncated IS ``tis`` c and its bias proxy E[(r - c)_+], Sec. 3.2);
r = pi_current / pi_behav throughout.

Nothing here needs torch: it imports numpy, pyarrow (to read logs), ``replay_theory.theory`` and
``replay_theory.core.losses`` (M2PO's mask), never ``replay_theory.validate``.
"""

import importlib

#: public name -> the module that defines it; loaded on first use (PEP 562), so that commands which never
#: diagnose a log (``replay-theory optimal``) do not pay for the pipeline's imports
_EXPORTS = {"ConfigError": "errors", "DiagnoseConfig": "pipeline", "diagnose": "pipeline", "load_report": "report",
            "render": "report", "PRESETS": "schema", "ColumnMap": "schema", "resolve_columns": "schema",
            "WhatIfConfig": "whatif"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
