"""Integrations of replay-theory into the trainers people run (issue 14).

Paper: experience-replay (docs/REFERENCES.md): N (buffer size), B (batch size), R (rollouts per step).
``buffer`` (framework-free FIFO of whole GRPO groups, :class:`~replay_theory.integrations.buffer.ReplayConfig`),
``loss`` (the shared losses of simulate/losses in a torch autograd graph; torch only),
``export`` (``DiagnoseLogWriter``: the rows a trainer trained on as a ``diagnose`` log; numpy + pyarrow),
``trl`` (``ReplayGRPOTrainer``, a TRL ``GRPOTrainer`` subclass, and ``DiagnoseLogCallback``; needs the ``trl``
extra).
"""
