"""The shared arithmetic (cpp/include/dcoco/math.h) through the compiled CPU build."""

import math

import pytest
import torch
import torch.nn.functional as F

from dcoco import _C


def test_gelu_is_the_erf_form():
    """0.5 x (1 + erf(x / sqrt 2)) with the rational erf of math.h: |erf error| <= 3.3e-7 (scripts/fit_erf.py),
    so |GELU error| <= 0.5 |x| 3.3e-7 plus float32 rounding of the product."""
    xs = torch.cat([torch.linspace(-12, 12, 20001), torch.randn(500, generator=torch.Generator().manual_seed(1)) * 3])
    ours = torch.tensor([_C.gelu(float(x)) for x in xs], dtype=torch.float64)
    exact = F.gelu(xs.double())
    bound = 0.5 * xs.double().abs() * 3.3e-7 + 6e-8 * exact.abs() + 1e-12
    assert ((ours - exact).abs() <= bound).all(), (ours - exact).abs().max()
    # the tanh approximation differs by ~1e-3 near |x| = 2: make sure that is not what we compute
    assert abs(_C.gelu(2.0) - F.gelu(torch.tensor(2.0, dtype=torch.float64), approximate="tanh").item()) > 1e-5


def test_gelu_special_values():
    assert _C.gelu(0.0) == 0.0
    assert _C.gelu(math.inf) == math.inf
    assert math.isnan(_C.gelu(math.nan))


@pytest.mark.parametrize("n", [2, 7, 128, 256])
def test_layer_norm_matches_torch(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 5 + 100  # a large mean: the two-pass variance must hold up
    gamma, beta = torch.randn(n, generator=g), torch.randn(n, generator=g)
    plain = torch.tensor(_C.layer_norm(x.tolist()))
    torch.testing.assert_close(plain, F.layer_norm(x.double(), (n,), eps=1e-5).float(), rtol=1e-5, atol=2e-5)
    affine = torch.tensor(_C.layer_norm(x.tolist(), gamma.tolist(), beta.tolist()))
    want = F.layer_norm(x.double(), (n,), gamma.double(), beta.double(), eps=1e-5).float()
    torch.testing.assert_close(affine, want, rtol=1e-5, atol=2e-5)


def test_layer_norm_constant_row_is_finite():
    assert _C.layer_norm([3.0] * 8) == [0.0] * 8


def test_layer_norm_rejects_mismatched_affine():
    with pytest.raises(ValueError, match="gamma"):
        _C.layer_norm([1.0, 2.0], [1.0], [0.0])
