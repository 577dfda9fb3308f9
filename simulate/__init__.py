"""The vectorized simulator: every replay design of the papers on a bandit or a token MDP, all seeds at once.

Where things live (papers: docs/REFERENCES.md). The designs, buffers, losses, advantages and pipeline it runs are
the shared core's (``replay_theory.core``), the same ones the language-model validator and the TRL trainer use.

| module          | what                                                                              |
|-----------------|-----------------------------------------------------------------------------------|
| ``envs/``       | the environment registry: bandit (and its noisy verifier), token MDP, noisy quadratic |
| ``engine.py``   | the training loop: exact gradients, evaluations, curves                           |
| ``to_target.py``| train one design to a target, all step sizes and seeds at once (the benchmark's loop) |
| ``optim.py``    | Adam / SGD on the seed-stacked parameters                                         |
| ``config.py``   | ``SimConfig``: one run (``DesignConfig`` + environment, pipeline and seeds)        |
| ``calibrate.py``| sigma^2(s), rho, KL drift and the noise scale measured for the theory              |
| ``sweep.py``    | grids of runs (resumable, never overwritten), serial or joblib / dask / ray        |

The experiments built on it (the design-rule benchmark, the paper tables, the naive reference loop) live in
``replay_theory.experiments``.
"""
