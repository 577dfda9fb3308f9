"""``replay-theory diagnose``: off-policy health and what-if analysis of logged rollouts.

Reads a log of behaviour and current log-probs written by TRL, verl or any
trainer (``schema.py``), streams it (``reader.py``) into mergeable log-space
sums (``accumulators.py``), and reports the importance-weight quantities of
``theory/divergences.py`` overall, per sequence and per sample age, the theory
bounds with their slack (``theory/bounds.py``), the KL drift with age and the
FreshPER tau it implies (``drift.py``), and what other corrections would have
done to the same tokens (``whatif.py``).  ``pipeline.diagnose`` runs the pass;
``report.py`` renders it.  Nothing here needs torch.
"""

from replay_theory.diagnose.pipeline import DiagnoseConfig, diagnose
from replay_theory.diagnose.schema import PRESETS, ColumnMap, resolve_columns
from replay_theory.diagnose.whatif import WhatIfConfig

__all__ = ["DiagnoseConfig", "diagnose", "PRESETS", "ColumnMap", "resolve_columns", "WhatIfConfig"]
