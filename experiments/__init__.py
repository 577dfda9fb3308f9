"""Experiments, apart from the library (bsuite-style: each one its config, runner and analysis in one module).

They use ``replay_theory.core``, ``simulate``, ``validate``, ``diagnose`` and ``integrations``; no library module
imports them, except the CLI commands that run them.

| module              | experiment                                                                          |
|---------------------|-------------------------------------------------------------------------------------|
| ``theory_bench/``   | the design-rule benchmark (``replay-theory experiment theory-test``; advise/evidence.json) |
| ``theory_pool.py``  | several readings of the benchmark's protocol pooled into one record (advise/evidence.json) |
| ``paper_tables.py`` | the six result tables of docs/SIMULATION.md (``replay-theory experiment NAME``)     |
| ``naive.py``        | the per-seed Python loop the vectorised engine is checked and timed against        |
| ``proxy_check.py``  | log-probs-only calibration checked against the simulator's exact profiles          |
| ``lm_horizon.py``   | a horizon-family LM run read against the forgetting-aware model (docs/VALIDATION.md) |
| ``example_log.py``  | writes example rollout logs in TRL / verl / default shapes for ``diagnose``        |
"""
