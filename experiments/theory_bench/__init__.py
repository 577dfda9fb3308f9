"""The prediction benchmark of ``replay-theory experiment theory-test`` as a package (after bsuite's split).

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018 (arXiv
1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py``. Protocol: docs/SIMULATION.md, 'Does a
design rule predict?'. Each module imports only those before it:

| module          | holds                                                                                  |
|-----------------|----------------------------------------------------------------------------------------|
| ``options``     | protocol constants (B = 256, group G, grids, instances), settings, options             |
| ``store``       | the run store (resume), the instance records (target, smoothness)                       |
| ``inputs``      | the rule's inputs from arrays: per-sample gradients, B_crit, kappa pairs, drift, B_noise fit |
| ``measure``     | one unit's training: step-size search, the pilot (B_noise, kappa, M2(s)), optimal's answer |
| ``objectives``  | each rule's predicted cost per design (J, S_min (1 + B_noise/B), the forgetting rule)    |
| ``score``       | the cells' regrets and Spearman rho, the targets, the run, summary.json, evidence.json  |
| ``tables``      | the text tables                                                                         |

Every name callers used from ``experiments/theory_test.py`` is re-exported here. Patch a name where it is looked up
(``score.run_unit``, ``measure.train_unit``), not here.
"""

from . import options as _options
from .inputs import (
    b_crit_record,
    b_noise_kind,
    curvature_pairs_kappa,
    drift_staleness,
    fit_noise_scale,
    log_compute,
    loss_hvp,
    measure_drift,
    measure_staleness,
    measured_alpha,
    pilot_affordable,
    pilot_compute,
    pilot_steps,
    read_b_noise,
    rescore_compute,
    sample_grads,
)
from .measure import (
    RECIPE,
    Unit,
    UnitNotScored,
    _designs_of,
    _step_cap,
    calibration_record,
    design_row,
    design_steps,
    measure_noise_scale,
    measure_pilot,
    measure_recipe_log,
    pilot_query,
    printed_design,
    printed_label,
    printed_ratios,
    printed_work_ratios,
    run_unit,
    staleness_of,
    train_printed,
    train_unit,
    tune_at_batch,
)
from .objectives import (
    OBJECTIVES,
    PRINTED,
    WORK_BUDGET,
    Designs,
    NoPick,
    Objective,
    b_noise_no_pick,
    design_steps_row,
    measured_compute,
    objective_values,
    rule_values,
)
from .options import *  # noqa: F403 -- options.__all__, the protocol's public names, re-exported whole
from .score import (
    REPLAY_MARGIN,
    _objective_target,
    _protocol,
    _replay_branch,
    _route_shares,
    check_out,
    horizon_check,
    not_scored_cell,
    options_text,
    run_theory_test,
    score_cell,
    score_printed,
    score_work_budget,
    spearman,
    summarise,
    targets,
    unit_checks,
    write_evidence,
)
from .store import Env, Store, _key, build_env, exact_hessian, instance_record
from .tables import (
    SPEC,
    _worst_text,
    cells_table,
    load_summary,
    summary_table,
    targets_text,
    theory_test_table,
    units_table,
)

__all__ = [
    *_options.__all__, "Env", "Store", "_key", "build_env", "exact_hessian", "instance_record", "RECIPE", "Unit",
    "UnitNotScored", "_designs_of", "loss_hvp", "_step_cap", "b_crit_record", "b_noise_kind", "calibration_record",
    "curvature_pairs_kappa", "design_row", "drift_staleness", "log_compute",
    "design_steps", "fit_noise_scale", "measure_drift", "measure_noise_scale",
    "measure_pilot", "measure_recipe_log", "measure_staleness", "measured_alpha", "pilot_affordable", "pilot_compute",
    "pilot_query", "pilot_steps", "printed_design", "printed_label", "printed_ratios", "printed_work_ratios",
    "read_b_noise", "rescore_compute", "run_unit", "sample_grads", "staleness_of", "train_printed", "train_unit",
    "tune_at_batch",
    "Designs", "NoPick",
    "OBJECTIVES", "Objective", "PRINTED", "WORK_BUDGET", "b_noise_no_pick", "design_steps_row", "measured_compute",
    "objective_values", "rule_values", "REPLAY_MARGIN", "_objective_target", "_protocol", "_replay_branch",
    "_route_shares", "check_out", "horizon_check", "not_scored_cell", "options_text", "run_theory_test", "score_cell",
    "score_printed",
    "score_work_budget", "spearman", "summarise", "targets", "unit_checks", "write_evidence", "SPEC", "_worst_text",
    "cells_table", "load_summary", "summary_table", "targets_text", "theory_test_table", "units_table"]
