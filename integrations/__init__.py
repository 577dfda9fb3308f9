"""Integrations of replay-theory into the trainers people run (issue 14).

Paper: experience-replay (docs/REFERENCES.md): N (buffer size), B (batch size), R (rollouts per step).
``replay_config`` (:class:`~replay_theory.integrations.replay_config.ReplayConfig`: N, B, R, the buffer design and
the loss; no torch), ``buffer`` (``RowReplayBuffer``: a trainer's rows, selected by the shared design registry of
core/designs.py; torch), ``loss`` (the shared losses of core/losses.py in a torch autograd graph; torch only),
``export`` (``DiagnoseLogWriter``: the rows a trainer trained on as a ``diagnose`` log; numpy + pyarrow),
``trl`` (``ReplayGRPOTrainer``, a TRL ``GRPOTrainer`` subclass, and ``DiagnoseLogCallback``; the ``trl`` extra),
``verl`` (``VerlDiagnoseLogger``, ``VerlDiagnoseLogMixin``: verl batches as a ``diagnose --preset verl`` log;
numpy + pyarrow, verl not imported).

A library: it imports core/, theory/, diagnose/ (the log format), outputs.py and itself, never validate/,
experiments/ or cli/; ``replay-theory trl-replay`` (the trainer on the validator's Countdown and tiny Qwen2) is
validate/trl_run.py.
"""
