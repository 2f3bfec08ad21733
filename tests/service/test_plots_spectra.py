"""The numbers the spectrum plots draw (service.plots.spectra): normalized Gram spectra whose
mean log is minus the isometry gap, empirical distributions of singular values, layer choice."""

import math

import numpy as np
import pytest

from service.isometry import isometry_gap
from service.plots.spectra import (
    default_layers,
    jacobian_figure,
    normalized_spectra,
    singular_value_cdf,
    spectrum_figure,
)


@pytest.mark.parametrize(
    "depth,layers",
    [(1, [1]), (3, [1, 2, 3]), (6, [1, 2, 3, 4, 5, 6]), (50, [1, 11, 21, 30, 40, 50])],
)
def test_default_layers_spread_from_first_to_last(depth, layers):
    assert default_layers(depth) == layers


def test_normalized_spectrum_is_the_isometry_gap_in_log_units():
    """λ_k / mean λ, descending; −mean_k log(λ_k / mean λ) = log AM − log GM = the gap of any
    Gram with these eigenvalues (Joudaki et al. 2023, Eq. 3)."""
    rng = np.random.default_rng(0)
    lam = np.sort(rng.gamma(0.5, 2.0, size=(4, 30)), axis=1)[:, ::-1]  # (L, n), descending
    curves = normalized_spectra(lam, [1, 2, 3, 4])
    for ell, ratio in curves.items():
        assert ratio.mean() == pytest.approx(1.0, rel=1e-14)
        assert (np.diff(ratio) <= 0).all()
        gap = isometry_gap(np.diag(lam[ell - 1]))
        assert -np.log(ratio).mean() == pytest.approx(gap, rel=1e-12)


def test_normalized_spectrum_drops_padding_and_keeps_nothing_of_a_zero_gram():
    values = np.array([[4.0, 2.0, math.nan], [3.0, 1.0, -1e-18], [0.0, 0.0, 0.0]])
    curves = normalized_spectra(values, [1, 2, 3])
    np.testing.assert_allclose(curves[1], [4 / 3, 2 / 3])  # NaN padding dropped
    assert curves[2].size == 3 and curves[2][-1] < 0  # kept: the figure counts λ ≤ 0
    assert curves[3].size == 0  # the zero Gram has no normalized spectrum


def test_singular_value_cdf_pools_samples_and_leaves_out_nan_rows():
    values = np.array([[3.0, 1.0], [2.0, 0.5], [math.nan, math.nan]])
    sigma, F, dropped = singular_value_cdf(values)
    assert sigma.tolist() == [0.5, 1.0, 2.0, 3.0] and F.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert dropped == 1
    sigma, F, dropped = singular_value_cdf(np.full((2, 3), math.nan))
    assert sigma.size == 0 and F.size == 0 and dropped == 2


def test_figures_note_what_they_leave_out():
    lam = np.array([[2.0, 1.0, -1e-17], [1.0, 1.0, 1.0]])
    fig = spectrum_figure(lam, name="spectrum/act", epoch=3, layers=[1, 2], title="t")
    note = fig.axes[0].get_title(loc="left")
    assert "epoch 3" in note and "λ ≤ 0 not drawn" in note and "ℓ = 1: 1" in note
    lines = {"a": np.array([[1.0, 0.0]]), "b": np.array([[math.nan, 1.0], [2.0, 1.0]])}
    fig = jacobian_figure(lines, epoch=0, title="t", ordered=False)
    note = fig.axes[0].get_title(loc="left")
    assert "σ = 0 not drawn: a: 1" in note and "left out: b: 1" in note
    drawn = {line.get_label() for line in fig.axes[0].get_lines()}
    assert {"a", "b", "σ = 1 (dynamical isometry)"} <= drawn
