"""The promises of the l2norm family (its registration's ``INVARIANTS``): each test's first docstring paragraph
is the promise the traces show next to its node id."""
import pytest
import torch

from . import l2norm, oracle


@pytest.mark.parametrize("use_triton", [True, False])
def test_routes_equal_the_formula(use_triton):
    """Both routes equal the float64 formula, values and gradients, on rows of 1 to 2,100 columns."""
    for cols in (1, 7, 2100):
        x = torch.randn(4, cols, dtype=torch.float64, requires_grad=True)
        weights = torch.randn(4, cols, dtype=torch.float64)
        y = l2norm(x, use_triton=use_triton)
        (y * weights).sum().backward()
        torch.testing.assert_close(y.detach(), oracle.l2norm(x.detach()), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad, oracle.l2norm_grad(x.detach(), weights), rtol=1e-12, atol=1e-12)
