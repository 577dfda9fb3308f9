"""core/surrogate.py: the one numpy-gradient -> torch bridge the validator and the trainers share (hand values)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replay_theory.core.surrogate import gradient_tensor, surrogate  # noqa: E402


def _case():
    logp = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, -0.25, -3.0]], dtype=torch.float64, requires_grad=True)
    grad = np.array([[0.5, -1.0, 0.0], [2.0, 0.25, -0.75]])  # d loss / d logp; 0 on the padding token
    mask = torch.tensor([[True, True, False], [True, True, True]])
    return logp, grad, mask


def test_gradient_is_grad_logp_and_value_is_the_sum():
    logp, grad, _ = _case()
    total = surrogate(grad, logp)
    # sum grad * logp = 0.5(-1) + (-1)(-2) + 0 + 2(-0.5) + 0.25(-0.25) + (-0.75)(-3) = 2.6875
    assert float(total.detach()) == 2.6875
    (g,) = torch.autograd.grad(total, logp)
    assert torch.equal(g, torch.as_tensor(grad))


def test_value_and_mask_and_row_weight():
    logp, grad, mask = _case()
    with torch.no_grad():
        logp[0, 2] = float("nan")  # padding may hold anything
    weight = torch.tensor([2.0, 0.5])  # FreshPER w_i: row 0 doubled, row 1 halved
    total = surrogate(grad, logp, mask=mask, row_weight=weight, value=-7.5)
    assert float(total.detach()) == -7.5  # the loss's own value, not the surrogate's
    (g,) = torch.autograd.grad(total, logp)
    assert torch.equal(g, torch.tensor([[1.0, -2.0, 0.0], [1.0, 0.125, -0.375]], dtype=torch.float64))


def test_a_tensor_in_the_right_dtype_is_not_copied_so_chunks_slice_one_conversion():
    logp, grad, _ = _case()
    once = gradient_tensor(grad, logp.float())
    assert once.dtype == torch.float32 and gradient_tensor(once, logp.float()) is once
    # chunked (the validator's micro-batches): the summed chunk gradients are the whole-batch gradient, bit for bit
    lp = logp.detach().float().requires_grad_(True)
    surrogate(once[:1], lp[:1]).backward()
    surrogate(once[1:], lp[1:]).backward()
    whole = lp.detach().clone().requires_grad_(True)
    surrogate(grad, whole).backward()
    assert torch.equal(lp.grad, whole.grad)
