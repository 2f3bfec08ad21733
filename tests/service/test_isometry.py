"""The isometry gap's definition (docs/science.md; Joudaki et al. 2023, Sec. 3 and Theorem 1)."""

import math

import numpy as np
import pytest

from service.isometry import (
    centred_basis,
    gap_from_eigenvalues,
    gap_from_singular_values,
    gap_of_features,
    gram_of,
    isometry,
    isometry_gap,
)


def _random_gram(rng, n=6, d=9):
    H = rng.standard_normal((n, d)) @ rng.standard_normal((d, d))  # correlated, full rank
    return gram_of(H), H


def test_identity_and_multiples_have_zero_gap():
    for c in (1e-8, 1.0, 3.5, 1e8):
        assert isometry_gap(c * np.eye(5)) == pytest.approx(0.0, abs=1e-15)
        assert isometry(c * np.eye(5)) == pytest.approx(1.0, abs=1e-15)


def test_diag_3_1_is_log_am_over_gm():
    # eigenvalues 3 and 1: AM = 2, GM = √3, gap = log 2 − ½ log 3 = log(2/√3)
    expected = math.log(2) - 0.5 * math.log(3)
    assert isometry_gap(np.diag([3.0, 1.0])) == pytest.approx(expected, rel=1e-15)
    # not diagonal: a rotation leaves the eigenvalues and so the gap alone
    c, s = math.cos(0.3), math.sin(0.3)
    Q = np.array([[c, -s], [s, c]])
    G = Q @ np.diag([3.0, 1.0]) @ Q.T
    assert isometry_gap(G) == pytest.approx(math.log(2 / math.sqrt(3)), 1e-14)


def test_gap_from_eigenvalues_of_a_random_gram():
    G, _ = _random_gram(np.random.default_rng(0))
    lam = np.linalg.eigvalsh(G)
    expected = math.log(lam.mean()) - np.log(lam).mean()
    assert isometry_gap(G) == pytest.approx(expected, rel=1e-12)
    assert expected > 0.1  # a real test: far from isometry


def test_scale_invariance():
    G, _ = _random_gram(np.random.default_rng(1))
    for c in (1e-6, 0.5, 7.0, 1e9):
        assert isometry_gap(c * G) == pytest.approx(isometry_gap(G), rel=1e-12)


def test_singular_grams_are_plus_infinity():
    rng = np.random.default_rng(2)
    H = rng.standard_normal((5, 3))  # n > d: rank 3 < 5
    assert isometry_gap(gram_of(H)) == math.inf
    H = rng.standard_normal((5, 8))
    assert math.isfinite(isometry_gap(gram_of(H)))
    centered = H - H.mean(axis=0)  # the samples sum to zero, as after a centering BatchNorm
    assert isometry_gap(gram_of(centered)) == math.inf
    assert isometry_gap(np.zeros((4, 4))) == math.inf
    assert isometry_gap(np.ones((3, 3))) == math.inf  # rank one
    assert isometry(np.ones((3, 3))) == 0.0


def test_nearly_singular_but_resolvable_is_finite():
    # λ_min = 1e-10·λ_max is far above n·ε·λ_max: a real (large) finite gap, not +inf
    G = np.diag([1.0, 1.0, 1e-10])
    expected = math.log((2 + 1e-10) / 3) - math.log(1e-10) / 3
    assert isometry_gap(G) == pytest.approx(expected, rel=1e-12)


def test_singular_tolerance_is_relative_and_adjustable():
    n = 3
    eps = np.finfo(np.float64).eps
    just_above = np.diag([1.0, 1.0, 2 * n * eps])
    assert math.isfinite(isometry_gap(just_above))  # above n·ε·λ_max: resolvable
    assert isometry_gap(np.diag([1.0, 1.0, n * eps])) == math.inf  # at the threshold: singular
    assert isometry_gap(1e-30 * just_above) == pytest.approx(isometry_gap(just_above))  # relative
    assert isometry_gap(np.diag([1.0, 1.0, 1e-9]), rtol=1e-8) == math.inf  # e.g. a float32 H


def test_non_finite_entries_give_nan():
    G = np.eye(3)
    G[0, 1] = G[1, 0] = np.nan
    assert math.isnan(isometry_gap(G))


def test_stacks_match_one_by_one():
    rng = np.random.default_rng(3)
    grams = np.stack([_random_gram(rng)[0] for _ in range(4)] + [np.zeros((6, 6))])
    gaps = isometry_gap(grams.reshape(5, 1, 6, 6))
    assert gaps.shape == (5, 1)
    assert np.allclose(gaps[:4, 0], [isometry_gap(G) for G in grams[:4]], rtol=1e-14)
    assert gaps[4, 0] == math.inf
    assert gram_of(rng.standard_normal((2, 3, 4))).shape == (2, 3, 3)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="square"):
        isometry_gap(np.ones((2, 3)))
    with pytest.raises(ValueError, match="matrix"):
        gram_of(np.ones(3))


def test_theorem_1_normalization_ratio_is_am_over_gm_of_squared_norms():
    """Joudaki et al. 2023, Theorem 1: rows scaled to unit norm, I(G̃)/I(G) = AM(a²)/GM(a²)."""
    rng = np.random.default_rng(4)
    for trial in range(20):
        n = 2 + trial % 7
        H = rng.standard_normal((n, n + 3)) * rng.lognormal(0.0, 0.8, size=(n, 1))
        a = np.linalg.norm(H, axis=1)
        ratio = isometry(gram_of(H / a[:, None])) / isometry(gram_of(H))
        am, gm = np.mean(a**2), np.exp(np.mean(np.log(a**2)))
        assert ratio == pytest.approx(am / gm, rel=1e-9)
        assert ratio >= 1 + np.var(a) / np.mean(a) ** 2 - 1e-12  # the theorem's lower bound


def test_theorem_1_holds_for_trained_like_non_gaussian_rows():
    # deterministic: holds for any rows (here heavy-tailed, low rank-ish), not only at init
    rng = np.random.default_rng(5)
    H = rng.standard_t(2.0, size=(8, 10)) @ np.diag(np.linspace(0.1, 3, 10))
    a = np.linalg.norm(H, axis=1)
    gap_gain = isometry_gap(gram_of(H)) - isometry_gap(gram_of(H / a[:, None]))
    assert gap_gain == pytest.approx(math.log(np.mean(a**2)) - np.mean(np.log(a**2)), rel=1e-9)
    assert gap_gain > 0


# --- the definition with an explicit structural null dimension -----------------------------------


def test_gap_from_eigenvalues_drops_the_structural_null_dimension():
    lam = np.array([4.0, 1.0, 1e-300, 0.0])
    assert gap_from_eigenvalues(lam) == math.inf  # an exact zero
    assert gap_from_eigenvalues(lam, null_dim=1) == pytest.approx(
        math.log((5 + 1e-300) / 3) - math.log(4e-300) / 3, rel=1e-12
    )  # tiny but non-zero: finite, however small
    assert gap_from_eigenvalues(lam, null_dim=2) == pytest.approx(math.log(2.5) - math.log(2.0))
    assert gap_from_eigenvalues(lam[::-1], null_dim=2) == gap_from_eigenvalues(lam, null_dim=2)
    assert gap_from_eigenvalues(lam, null_dim=4) == math.inf  # nothing left
    assert math.isnan(gap_from_eigenvalues(np.array([1.0, np.nan])))
    with pytest.raises(ValueError, match="null_dim"):
        gap_from_eigenvalues(lam, null_dim=5)
    stack = gap_from_eigenvalues(np.stack([lam, lam]), null_dim=2)
    assert stack.shape == (2,)


def test_ill_conditioned_spectra_stay_finite_and_exact():
    """λ_min/λ_max = 1e-30: far below any rounding tolerance, and the definition does not care."""
    lam = np.logspace(0, -30, 100)
    want = math.log(lam.mean()) - np.log(lam).mean()
    assert gap_from_eigenvalues(lam) == pytest.approx(want, rel=1e-14)
    assert gap_from_singular_values(np.sqrt(lam)) == pytest.approx(want, rel=1e-12)


def test_centred_basis_is_an_orthonormal_basis_of_ones_complement():
    for n in (1, 2, 7, 100):
        Q = centred_basis(n)
        assert Q.shape == (n, n - 1)
        np.testing.assert_allclose(Q.T @ Q, np.eye(n - 1), atol=1e-14)
        np.testing.assert_allclose(np.ones(n) @ Q, 0.0, atol=1e-13)


def test_gap_of_features_uses_singular_values_and_the_structure():
    rng = np.random.default_rng(6)
    H = rng.standard_normal((6, 9))
    lam = np.linalg.eigvalsh(gram_of(H))
    assert gap_of_features(H) == pytest.approx(gap_from_eigenvalues(lam), rel=1e-12)
    C = H - H.mean(axis=0)  # batch-centred: G·1 = 0
    assert gap_of_features(C, ones_in_null=True) == math.inf
    # range gap: G on 1⊥ — the 5 non-trivial eigenvalues of the centred Gram
    nontrivial = np.linalg.eigvalsh(gram_of(C))[1:]
    assert gap_of_features(C, ones_in_null=True, rank=True) == pytest.approx(
        gap_from_eigenvalues(nontrivial), rel=1e-10
    )
    wide = rng.standard_normal((9, 4))  # n > d: rank 4, the range gap is that of Hᵀ H
    assert gap_of_features(wide) == math.inf
    assert gap_of_features(wide, rank=True) == pytest.approx(isometry_gap(wide.T @ wide), 1e-12)
    assert math.isnan(gap_of_features(np.full((3, 4), np.nan), rank=True))


def test_structural_null_dim_of_a_gram_given_as_numbers():
    assert isometry_gap(np.diag([1.0, 1e-20]), null_dim=0) == pytest.approx(
        math.log(0.5) - math.log(1e-20) / 2, rel=1e-12
    )  # structurally regular: finite, whatever λ_min is
    assert isometry_gap(np.diag([1.0, 1.0]), null_dim=1) == math.inf
