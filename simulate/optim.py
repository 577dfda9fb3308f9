"""Optimisers over a leading seed axis: plain SGD and Adam (Kingma & Ba 2014).

The experience-replay paper trains with Adam at a constant learning rate
(App. E.2); both keep one state row per seed so S runs advance in one numpy op.
"""

from __future__ import annotations

import numpy as np


class Adam:
    """Adam on parameters (S, d); ``step`` returns the new parameters."""

    def __init__(self, params: np.ndarray, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.first = np.zeros_like(params)  # (S, d)
        self.second = np.zeros_like(params)  # (S, d)
        self.count = 0

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        self.count += 1
        self.first = self.beta1 * self.first + (1 - self.beta1) * grad
        self.second = self.beta2 * self.second + (1 - self.beta2) * grad**2
        first_hat = self.first / (1 - self.beta1**self.count)
        second_hat = self.second / (1 - self.beta2**self.count)
        return params - self.lr * first_hat / (np.sqrt(second_hat) + self.eps)

    def preconditioner(self) -> np.ndarray:
        """D = 1 / (sqrt(v_hat) + eps) (S, d) of the state after ``count`` steps (v_hat = v / (1 - beta2^count),
        bias-corrected as ``step`` corrects it): the diagonal the next step applies to the first moment, and the
        coordinates in which kappa = eta tr(H Sigma) / tr Sigma is read for Adam (theory/forgetting.py)."""
        if self.count == 0:
            raise ValueError("Adam has taken no step: its second moment v, so its preconditioner, is not defined yet")
        return 1.0 / (np.sqrt(self.second / (1 - self.beta2**self.count)) + self.eps)


class SGD:
    """theta <- theta - lr * grad."""

    def __init__(self, params: np.ndarray, lr: float):
        self.lr = lr

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        return params - self.lr * grad

    def preconditioner(self) -> None:
        """None: SGD's step is the gradient itself (the identity preconditioner)."""
        return None


OPTIMIZERS = {"adam": Adam, "sgd": SGD}
