"""Vectorized bandit / token-MDP simulator of replay designs (issue 3).

Empty until the simulator lands: buffers, samplers and losses will live here and
be imported, not copied, by ``replay_theory.validate``.
"""
