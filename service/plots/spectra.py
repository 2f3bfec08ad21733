"""Plots of stored spectra (service.store.spectra), per trial: PNG or SVG bytes.

- `spectrum`: the eigenvalues of one Gram kind (`spectrum/linear|norm|act|weight`) at one epoch,
  per layer, normalized by their mean and sorted, λ_k / mean(λ) against rank k on a log y axis,
  a few layers coloured by depth — as the literature draws Gram spectra (e.g. Joudaki et al.
  2023, Fig. 1). An isometric Gram is the flat line λ_k / mean λ = 1, drawn dashed; the isometry
  gap is −mean_k log(λ_k / mean λ), the mean depth of the curve under that line in log units.
- `jacobian_spectrum`: the singular values of the input–output Jacobian (pooled over the k probe
  samples) of one or more trials, as empirical distribution functions F(σ) = #{σ_j ≤ σ}/N on a
  log σ axis, one line per trial coloured by depth, the line σ = 1 marked: dynamical isometry
  (Pennington et al. 2017) is F jumping from 0 to 1 at σ = 1.

The series functions return the numbers each kind draws. Matplotlib is imported only when a
figure is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from service.config import CONFIG_FIELDS, SPECTRUM_KEYS
from service.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SPECTRUM_PLOT_KINDS: tuple[str, ...] = ("spectrum", "jacobian_spectrum")
JACOBIAN_KEY = "jacobian_singular_values"
GRAM_SPECTRA = tuple(k for k in SPECTRUM_KEYS if k.startswith("spectrum/"))  # eigenvalues
DEFAULT_SPECTRUM = "spectrum/act"
MAX_LAYER_LINES = 6  # layers drawn by default, evenly spread from the first to the last
MAX_LAYERS = 12  # layers one spectrum plot may draw
MAX_TRIALS = 12  # trials one jacobian_spectrum plot may draw
FORMATS = ("png", "svg")


# --- series -------------------------------------------------------------------------------------


def default_layers(depth: int, most: int = MAX_LAYER_LINES) -> list[int]:
    """Up to `most` layers evenly spread over 1..depth, always the first and the last."""
    return sorted({int(np.rint(v)) for v in np.linspace(1, depth, min(most, depth))})


def normalized_spectra(values: np.ndarray, layers: Sequence[int]) -> dict[int, np.ndarray]:
    """Layer ℓ → λ_k / mean(λ), descending, of row ℓ − 1 of an (L, n) eigenvalue array.

    NaN entries (padding of a shorter first layer, or a non-finite Gram) are dropped first; a
    layer with no finite eigenvalue, or a non-positive mean (the zero Gram), gives an empty
    array. Non-positive λ (rounding of a singular Gram) stay in: the figure counts them.
    """
    out: dict[int, np.ndarray] = {}
    for ell in layers:
        row = values[ell - 1]
        lam = np.sort(row[np.isfinite(row)])[::-1]
        mean = lam.mean() if lam.size else 0.0
        out[ell] = lam / mean if mean > 0 else np.empty(0)
    return out


def singular_value_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(σ ascending, F(σ) = rank / N, NaN rows dropped) of a (k, m) singular-value array pooled
    over its samples; also how many rows (samples) were dropped for holding NaN."""
    finite = np.isfinite(values).all(axis=1)
    sigma = np.sort(values[finite].ravel())
    F = np.arange(1, sigma.size + 1) / max(sigma.size, 1)
    return sigma, F, int((~finite).sum())


# --- figures ------------------------------------------------------------------------------------


def spectrum_figure(
    values: np.ndarray,
    *,
    name: str,
    epoch: int,
    layers: Sequence[int],
    title: str,
    note: str | None = None,
) -> Figure:
    from service.plots import draw

    curves = normalized_spectra(values, layers)
    fig, (ax,) = draw.new_figure()
    colors = draw.palette([str(ell) for ell in curves], sequential=True)
    hidden = {}
    for ell, ratio in curves.items():
        k = np.arange(1, ratio.size + 1)
        positive = ratio > 0
        hidden[ell] = int((~positive).sum())
        ax.plot(k[positive], ratio[positive], color=colors[str(ell)], label=f"ℓ = {ell}", lw=1.3)
    ax.axhline(1.0, color="0.3", ls="--", lw=1, label="isometry: λ = mean λ")
    if any(r.size and (r > 0).any() for r in curves.values()):
        ax.set_yscale("log")
    draw.label_axes(ax, "rank k (eigenvalues in descending order)",
                    f"λ_k / mean λ of the {_gram_text(name)}")  # fmt: skip
    draw.legend(ax, ax.get_legend_handles_labels()[0], title="layer")
    notes = [*filter(None, [note]), f"epoch {epoch}", f"{values.shape[1]} eigenvalues per layer"]
    if any(hidden.values()):
        text = ", ".join(f"ℓ = {ell}: {n}" for ell, n in hidden.items() if n)
        notes.append(f"λ ≤ 0 not drawn on the log axis ({text})")
    return _finish(fig, ax, title, notes)


def jacobian_figure(
    lines: dict[str, np.ndarray], *, epoch: int | str, title: str, ordered: bool
) -> Figure:
    """lines: label → (k, m) singular values of one trial."""
    from service.plots import draw

    fig, (ax,) = draw.new_figure()
    colors = draw.palette(list(lines), sequential=ordered)
    notes, zeros, dropped = [f"epoch {epoch}"], {}, {}
    for label, values in lines.items():
        sigma, F, dropped[label] = singular_value_cdf(values)
        positive = sigma > 0
        zeros[label] = int((~positive).sum())
        ax.step(sigma[positive], F[positive], where="post", color=colors[label], label=label)
    ax.axvline(1.0, color="0.3", ls="--", lw=1, label="σ = 1 (dynamical isometry)")
    if any((v[np.isfinite(v)] > 0).any() for v in lines.values()):
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    draw.label_axes(ax, "singular value σ of ∂h_L(x_i)/∂x_i",
                    "fraction of singular values ≤ σ (pooled over probe samples)")  # fmt: skip
    draw.legend(ax, ax.get_legend_handles_labels()[0])
    shapes = {f"{v.shape[0]} × {v.shape[1]}" for v in lines.values()}
    notes.append(f"samples × values: {', '.join(sorted(shapes))}")
    if any(zeros.values()):
        notes.append("σ = 0 not drawn: " + ", ".join(f"{k}: {n}" for k, n in zeros.items() if n))
    if any(dropped.values()):
        text = ", ".join(f"{k}: {n}" for k, n in dropped.items() if n)
        notes.append(f"samples with NaN (diverged) left out: {text}")
    return _finish(fig, ax, title, notes)


def _gram_text(name: str) -> str:
    kind = name.removeprefix("spectrum/")
    if kind == "weight":
        return "weight Gram W_ℓ W_ℓᵀ (smaller side)"
    return f"sample Gram H Hᵀ of each block's {kind} output"


def _finish(fig: Figure, ax: Any, title: str, notes: list[str]) -> Figure:
    from service.plots import draw

    draw.title(fig, title)
    draw.caption(ax, " · ".join(notes))
    return fig


# --- from the store -----------------------------------------------------------------------------


def make_spectrum_plot(
    store: Any,
    trial_id: int,
    kind: str,
    *,
    name: str | None = None,
    epoch: int | str | None = None,
    layers: Sequence[int] | None = None,
    compare: Sequence[int] = (),
    fmt: str = "png",
) -> bytes:
    """One spectrum plot of a stored trial as PNG or SVG bytes (docs/plots.md, "Spectra"); its
    chart as JSON is service.plots.charts_search.make_spectrum_chart (the same checks, numbers).

    Args:
        store: a service.store.Store.
        kind: `spectrum` or `jacobian_spectrum`.
        name: `spectrum`: the Gram kind, default `spectrum/act`; `jacobian_spectrum`: only
            `jacobian_singular_values` (or None).
        epoch: a stored epoch or "last" (default: the highest stored).
        layers: `spectrum`: the layers drawn (default up to 6 spread over depth).
        compare: `jacobian_spectrum`: more trials drawn beside this one (e.g. other depths).

    Raises:
        NotFound: an unknown kind or trial.
        InvalidInput: a name, layer, epoch or parameter the kind does not take, naming it.
        LimitExceeded: the read is over Settings.max_points.
    """
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown format {fmt!r}", field="format", allowed=FORMATS)
    from service.plots import draw

    figures = {"spectrum": spectrum_figure, "jacobian_spectrum": jacobian_figure}
    fig = build_spectrum_with(
        figures, draw.no_data, store, trial_id, kind, name=name, epoch=epoch, layers=layers,
        compare=compare,
    )  # fmt: skip
    from service.plots.draw import to_bytes

    return to_bytes(fig, fmt)


def build_spectrum_with(
    builders: dict[str, Any],
    no_data: Any,
    store: Any,
    trial_id: int,
    kind: str,
    *,
    name: str | None = None,
    epoch: int | str | None = None,
    layers: Sequence[int] | None = None,
    compare: Sequence[int] = (),
) -> Any:
    """The checks of make_spectrum_plot, then `builders[kind]` (spectrum_figure and
    jacobian_figure, or a chart's: service.plots.charts_search), or `no_data(title, reason)`
    where nothing is stored: one path, so a figure and its chart refuse the same requests."""
    if kind not in SPECTRUM_PLOT_KINDS:
        raise NotFound(f"no spectrum plot kind {kind!r} (kinds: {', '.join(SPECTRUM_PLOT_KINDS)})")
    epoch = "last" if epoch is None else epoch
    if kind == "spectrum":
        if compare:
            msg = "spectrum draws one trial; compare is for jacobian_spectrum"
            raise InvalidInput(msg, field="compare")
        name = name or DEFAULT_SPECTRUM
        return _spectrum_plot(builders, no_data, store, trial_id, name, epoch, layers)
    if layers:
        raise InvalidInput("jacobian_spectrum has no layers", field="layer")
    if name not in (None, JACOBIAN_KEY):
        raise InvalidInput(f"{name!r} is not drawn here", field="name", allowed=[JACOBIAN_KEY])
    return _jacobian_plot(builders, no_data, store, [trial_id, *compare], epoch)


def _spectrum_plot(
    build: dict[str, Any], no_data: Any, store: Any, trial_id: int, name: str,
    epoch: int | str, layers: Sequence[int] | None,
) -> Any:  # fmt: skip

    if name not in GRAM_SPECTRA:
        raise InvalidInput(f"spectrum draws a Gram spectrum, not {name!r}", field="name",
                           allowed=GRAM_SPECTRA)  # fmt: skip
    config = store.get_trial(trial_id).config
    depth = config["depth"]
    chosen = list(layers) if layers else default_layers(depth)
    bad = [ell for ell in chosen if not 1 <= ell <= depth]
    if bad:
        raise InvalidInput(f"layer {bad[0]} of a depth-{depth} trial: 1..{depth}", field="layer")
    if len(set(chosen)) > MAX_LAYERS:
        raise InvalidInput(f"at most {MAX_LAYERS} layers in one plot", field="layer")
    title = f"trial {trial_id}: {name} eigenvalues per layer"
    found = store.spectra(trial_id, name=name, epoch=epoch)
    if not found:
        return no_data(title, f"no {name} stored (the trial's `spectra` option is off?)")
    s = found[0]
    return build["spectrum"](
        s.values, name=name, epoch=s.epoch, layers=sorted(set(chosen)), title=title,
        note=config_note(config),
    )  # fmt: skip


def config_note(config: dict[str, Any]) -> str:
    """The network in a few words: "depth 50, width 100, tanh, norm batch, init orthogonal"."""
    keys = ("depth", "width", "activation", "norm", "init")
    return ", ".join(f"{k} {config[k]}" if k != "activation" else str(config[k]) for k in keys)


def _jacobian_plot(
    build: dict[str, Any], no_data: Any, store: Any, trial_ids: list[int], epoch: int | str
) -> Any:

    ids = list(dict.fromkeys(trial_ids))
    if len(ids) > MAX_TRIALS:
        raise InvalidInput(f"at most {MAX_TRIALS} trials in one plot", field="compare")
    trials = sorted((store.get_trial(t) for t in ids), key=lambda t: (t.config["depth"], t.id))
    labels = _labels(trials)
    lines, epochs = {}, set()
    for t in trials:
        found = store.spectra(t.id, name=JACOBIAN_KEY, epoch=epoch)
        if found:
            lines[labels[t.id]] = found[0].values
            epochs.add(found[0].epoch)
    title = "input–output Jacobian singular values"
    if not lines:
        return no_data(title, "no Jacobian stored (the trials' jacobian_samples is 0?)")
    shown = epochs.pop() if len(epochs) == 1 else "last of each trial"
    ordered = len({t.config["depth"] for t in trials}) > 1
    return build["jacobian_spectrum"](lines, epoch=shown, title=title, ordered=ordered)


def _labels(trials: list[Any]) -> dict[int, str]:
    """trial id → "trial 7: depth 50, init gaussian": the config fields that differ among the
    trials drawn (depth always)."""
    fields = [f for f in CONFIG_FIELDS if len({str(t.config.get(f)) for t in trials}) > 1]
    fields = ["depth", *(f for f in fields if f != "depth")]
    return {
        t.id: f"trial {t.id}: " + ", ".join(f"{f} {t.config.get(f)}" for f in fields[:4])
        for t in trials
    }
