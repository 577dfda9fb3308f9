"""Real-model validation on a Qwen2-architecture language model.

Paper: experience-replay (docs/REFERENCES.md). The validator trains through the simulator's pipeline
(``replay_theory.core.pipeline``: the same designs, buffers, losses and compute accounting) and uses
the divergences of ``replay_theory.theory``:
``policy`` (build, load, checkpoint), ``logprobs`` (prompt encoding, log-probs), ``sampling`` (the HF
sampling loop), ``sft`` (warm start), ``engines`` / ``vllm_engine`` (rollout engines),
``rl`` (training), ``calibrate`` (mu, sigma^2(s), rho), ``loop`` (calibrate -> predict -> verify), ``report``
(verify's report), ``trl_run`` (``replay-theory trl-replay``: integrations/trl.py's trainer on this model and task).
"""
