"""Real-model validation on a Qwen2-architecture language model (issue 4).

Paper: experience-replay (docs/REFERENCES.md). The validator reuses
the buffers and losses of ``replay_theory.simulate`` and the divergences of ``replay_theory.theory``:
``model`` (policy, HF sampling, log-probs), ``engines`` / ``vllm_engine`` (rollout engines),
``rl`` (training), ``calibrate`` (mu, sigma^2(s), rho), ``loop`` (calibrate -> predict -> verify).
"""
