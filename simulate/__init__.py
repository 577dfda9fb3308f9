"""The vectorized simulator: every replay design of the papers on a bandit or a token MDP, all seeds at once.

Where things live (papers: docs/REFERENCES.md):

| module          | what                                                                              |
|-----------------|-----------------------------------------------------------------------------------|
| ``designs.py``  | the design registry: params, buffer, loss, advantage, rules and batch step of each |
| ``pipeline.py`` | the pipeline the engine and the language-model validator share: batches, compute   |
| ``buffers.py``  | the buffers (FIFO, positive bias, FreshPER, RLOO group replay, ExGRPO, stale-k)    |
| ``losses.py``   | the losses (REINFORCE, GRPO, no trust region, M2PO, RLOO, AsymRE, ExGRPO shaping)  |
| ``advantages.py`` | group advantages (GRPO, group mean, leave-one-out)                               |
| ``envs/``       | bandit and Countdown-like token MDP with exact gradients and divergences          |
| ``engine.py``   | the training loop: exact gradients, evaluations, curves                           |
| ``config.py``   | ``SimConfig``: one run (``DesignConfig`` + environment, pipeline and seeds)        |
| ``calibrate.py``| sigma^2(s), rho and KL drift measured for the theory                               |
| ``sweep.py``, ``experiments.py`` | grids of runs (resumable) and the docs/SIMULATION.md tables        |
| ``naive.py``    | the per-seed Python loop the vectorized engine is checked and timed against        |

``replay_theory.validate`` imports the same designs, buffers, losses and pipeline; nothing is copied.
"""
