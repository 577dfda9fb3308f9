"""The shared core: what the simulator, the language-model validator and the trainer integrations all run.

One implementation of each buffer, sampler, loss, advantage and pipeline step (papers: docs/REFERENCES.md). It
depends on ``replay_theory.theory`` only; ``simulate/``, ``validate/``, ``integrations/`` and ``diagnose/`` import
it, never the other way round.

| module            | what                                                                                  |
|-------------------|---------------------------------------------------------------------------------------|
| ``designs.py``    | THE registry: every buffer design and loss by name, its help, params, rules, step     |
| ``surrogate.py``  | numpy loss gradient -> torch scalar (the validator's and the trainers'; imports torch)|
| ``pipeline.py``   | the pipeline the engine and the language-model validator share: batches, compute      |
| ``buffers/``      | the buffers, a module per kind (uniform, FreshPER, RLOO, ExGRPO, stale-k and epochs)  |
| ``sumtree.py``    | the sum tree behind prioritized sampling                                              |
| ``losses.py``     | the losses (REINFORCE, GRPO, no trust region, M2PO, RLOO, AsymRE, ExGRPO shaping)     |
| ``advantages.py`` | group advantages (GRPO, group mean, leave-one-out)                                    |
| ``rollouts.py``   | ``RolloutBatch``: the arrays a buffer stores, seed axis first                         |
| ``rng.py``        | per-seed random streams drawn as one (``PerSeedGenerator``)                           |
| ``progress.py``   | the progress bar with an ETA every long job prints to stderr                          |
| ``jobs.py``       | ``--jobs``: independent runs in worker processes (the sweeps, verify; joblib's loky)  |
| ``memory.py``     | every size option bounded before work: a 2**31 - 1 ceiling and the memory a run needs |
| ``metrics.py``    | the per-step off-policy metrics of the engine, the validator and the TRL trainer      |
"""
