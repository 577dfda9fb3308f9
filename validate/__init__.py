"""Real-model validation on a Qwen2-architecture language model (issue 4).

Empty until the validator lands; it will reuse the buffers and losses of
``replay_theory.simulate`` and the divergences of ``replay_theory.theory``.
"""
