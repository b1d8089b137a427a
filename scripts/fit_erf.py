"""Fits the rational erf of cpp/include/dcoco/math.h: erf(x) ~ x P(x^2) / Q(x^2) on [0, 3.92], degrees (5, 6).

Weighted least squares with Lawson-style reweighting towards the minimax error (numpy, scipy, mpmath), then
checked in float32 exactly as math.h evaluates it. Beyond |x| = 3.92 float32 erf is +-1. Prints the
coefficients and the float32 error against mpmath (max abs error ~3.2e-7; libm erff: ~6e-8).

  python scripts/fit_erf.py
"""

import mpmath
import numpy as np
from scipy.optimize import least_squares

N_P, N_Q, X = 5, 6, 3.92


def main() -> None:
    x = np.linspace(1e-4, X, 3000)
    f = np.array([float(mpmath.erf(v)) for v in x])
    t = x * x

    def model(c):
        p, q = c[:N_P + 1], np.concatenate([[1.0], c[N_P + 1:]])
        return x * np.polyval(p[::-1], t) / np.polyval(q[::-1], t)

    lin = np.hstack([np.vander(t, N_P + 1, increasing=True) * x[:, None],
                     -f[:, None] * np.vander(t, N_Q + 1, increasing=True)[:, 1:]])
    c, *_ = np.linalg.lstsq(lin, f, rcond=None)
    w = np.ones_like(x)
    for _ in range(8):
        c = least_squares(lambda c: (model(c) - f) * w, c, xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=20000).x  # noqa: B023 (called in this iteration)
        e = np.abs(model(c) - f)
        w *= 1 + 5 * e / e.max()
    p = c[:N_P + 1].astype(np.float32)
    q = np.concatenate([[1.0], c[N_P + 1:]]).astype(np.float32)
    xs = np.linspace(-6, 6, 600001).astype(np.float32)
    xc = np.clip(xs, -X, X).astype(np.float32)
    tt = (xc * xc).astype(np.float32)
    P, Q = np.zeros_like(xc), np.zeros_like(xc)
    for k in p[::-1]:
        P = (P * tt + k).astype(np.float32)
    for k in q[::-1]:
        Q = (Q * tt + k).astype(np.float32)
    approx = np.where(np.abs(xs) > X, np.sign(xs), xc * P / Q)
    exact = np.array([float(mpmath.erf(float(v))) for v in xs])
    print("p =", [float(v) for v in p])
    print("q =", [float(v) for v in q])
    print("float32 max abs error:", float(np.abs(approx - exact).max()))


if __name__ == "__main__":
    main()
