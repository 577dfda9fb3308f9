"""replay-theory: how to reuse rollouts in RL post-training of LLMs.

Sub-packages
------------
theory        symbolic and numeric derivations (importance weights, noise scale, optimal buffer design)
core          what every part shares: designs, buffers, losses, advantages, the pipeline, random streams
simulate      vectorized bandit / token-MDP / quadratic simulator of replay designs
validate      the same training on a Qwen2-architecture language model
diagnose      statistics of logged rollouts (importance weights, by age, what-if corrections)
integrations  the replay buffer inside TRL, a logging hook for verl
experiments   the benchmark and paper-table experiments, apart from the library
cli           the ``replay-theory`` command line
figures       figures rebuilt from theory and from saved results
"""

import os as _os

__version__ = "0.1.0"

#: How a user installs torch without a GPU: PyPI's Linux torch wheel is the CUDA build (several GB of NVIDIA
#: libraries), so PyTorch's own CPU index comes first, as README's Set-up says. Every missing-torch message uses it.
TORCH_CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def install_hint(extra: str) -> str:
    """The install advice for an extra that brings torch, as one clause of a one-line error."""
    return f"pip install 'replay-theory[{extra}]' (without a CUDA GPU, first {TORCH_CPU_INSTALL})"

# Same seed, same numbers at any --threads: Intel MKL (torch's CPU BLAS) splits a matrix product's inner dimension
# across threads on AVX-512 machines, so a backward pass at 2 threads differed from 1 thread in the last bits (the SFT
# warm start drifted 1e-6 per step; tests/integration/test_validate_determinism.py). MKL's conditional numerical
# reproducibility mode with STRICT (results independent of the thread count; COMPATIBLE alone left some shapes
# differing) removes that; it must be set before torch loads MKL, hence here. A value the user set is kept.
_os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")
