"""replay-theory: how to reuse rollouts in RL post-training of LLMs.

Sub-packages
------------
theory    symbolic and numeric derivations (importance weights, optimal buffer design)
simulate  vectorized bandit / token-MDP simulator of replay designs
validate  the same training on a Qwen-architecture language model
cli       the ``replay-theory`` command line
figures   figures rebuilt from theory and from saved results
"""

__version__ = "0.1.0"
