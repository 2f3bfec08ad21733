"""`isosweep theory`: Hermite coefficients, isometry strength β and mean-field gap predictions.

    isosweep theory tanh --gain 1.5                      # coefficients and β of σ(1.5·x)
    isosweep theory tanh --depth 20 --input-gram g.npy   # the mean-field gap at blocks 1..20
    isosweep theory --trial 12                           # the same from a stored trial
    isosweep theory predict --set norm=batch --set depth=20  # a trial's whole record, predicted
    isosweep theory predict --trial 12                   # a stored trial's, as theory_overlay

Coefficients below the quadrature's accuracy (COEFFICIENT_ACCURACY·‖σ‖, ‖σ‖² = E σ(αX)²;
service.theory.hermite_coefficients is accurate to ~1e-15·‖σ‖) print as 0: they are zero up
to rounding (the odd ones of relu beyond c₁, the even ones of tanh).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.markup import escape

from api.cli.common import CommandError, out
from service.errors import InvalidInput

# |cₖ| below this fraction of ‖σ‖ is rounding: ten times the documented 1e-15 accuracy of
# service.theory.hermite_coefficients (docs/science.md, "Hermite coefficients").
COEFFICIENT_ACCURACY = 1e-14


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "theory",
        help="Hermite coefficients, β and mean-field gap predictions of an activation",
        description=(
            "What the theory predicts for σ(α·x) (Joudaki et al. 2023): the normalized Hermite "
            "coefficients c_0..c_K, the isometry strength β = 2 − c_1²/Σ_{k≥1} c_k², κ′(0) = 2 − β "
            "and, with --depth and an input Gram, the mean-field isometry gap of a LayerNorm MLP "
            "(Linear → σ → center → normalize) at every depth. `isosweep theory --list` (or "
            "`theory list`) prints the registry with β."
        ),
    )
    p.add_argument("activation", nargs="?", help="a registered activation, `list`, or `predict`")
    p.add_argument("--list", action="store_true", help="every registered activation with its β")
    p.add_argument("--gain", type=float, help="input gain α (default 1; --trial: its own)")
    p.add_argument("--terms", type=int, default=20, help="highest coefficient index K (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON (NaN/±inf as strings)")
    p.add_argument("--depth", type=int, help="predict the gap at blocks 1..L (needs a Gram; "
                   "--trial: its depth unless given)")  # fmt: skip
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--input-gram", type=Path, metavar="FILE", help="(n, n) input Gram: .npy, .csv or .json"
    )
    src.add_argument(
        "--inputs", type=Path, metavar="FILE", help="(n, d) input batch: .npy, .csv or .json"
    )
    src.add_argument(
        "--trial",
        type=int,
        metavar="ID",
        help="a stored trial: its input Gram (recorded with epoch 0), input moments, depth, "
        "activation, gains and centering (from --database-url); with predict, its whole "
        "record predicted on its stored inputs (as theory_overlay draws it)",
    )
    p.add_argument("--database-url", help="the store of --trial (default ISOSWEEP_DATABASE_URL)")
    p.add_argument("--gain-exponent", type=float, help="p: α_ℓ = α·ℓ^(−p) (default 0)")
    p.add_argument(
        "--stage", default="norm", help="Gram of which sub-layer: linear, act, norm (default)"
    )
    p.add_argument(
        "--uncentered", action="store_true", help="scale-only normalization (layer_scale)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        metavar="KEY=VALUE",
        help="predict: a TrialConfig field (repeatable), e.g. --set norm=batch; the mean-field "
        "prediction of the trial's epoch-0 record (rms, mean_cosine, gaps, grad_norm)",
    )
    p.add_argument(
        "--samples", type=int, default=1 << 14, help="predict: Monte Carlo draws (BatchNorm)"
    )
    p.set_defaults(func=run_theory)


def load_matrix(path: Path, field: str) -> np.ndarray:
    """A float64 matrix from .npy, .csv or .json (a list of rows, or an object with `field`)."""
    from service.jsonfmt import decode_float

    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)
        if suffix == ".csv":
            return np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
        if suffix == ".json":
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                data = data.get(field, data.get("data"))
            return np.array([[decode_float(v) for v in row] for row in data], dtype=np.float64)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}", field=field) from None
    except (ValueError, TypeError, KeyError) as exc:  # malformed contents
        raise InvalidInput(f"cannot read a matrix from {path}: {exc}", field=field) from None
    raise InvalidInput(
        f"unsupported file type {suffix!r}", field=field, allowed=[".npy", ".csv", ".json"]
    )


def _trial_inputs(args: argparse.Namespace) -> dict:
    """What --trial ID sets: the trial's activation, depth, gain and centering, its stored
    input Gram and moments turned into the first layer's covariance
    (service.plots.stored.theory_inputs: the gain is α·g·√s of the init, as the theory overlay
    uses it). Flags given beside --trial must agree with the trial, except --depth and --stage.

    Raises:
        InvalidInput: a flag that contradicts the trial, or a trial without a stored Gram.
        NotFound: no trial with this id.
    """
    from api.cli.run import open_store
    from service.plots.stored import THEORY_SETTING, theory_inputs

    store = open_store(args.database_url)
    try:
        trial = store.get_trial(args.trial)
        gram = store.input_gram(trial.id)
        moments = store.input_moments(trial.id)
    finally:
        store.close()
    c = trial.config
    if gram is None:
        raise InvalidInput(
            f"trial {trial.id} has no input Gram stored yet (it is recorded with epoch 0)",
            field="trial",
        )
    given = {"activation": args.activation, "gain": args.gain,
             "gain_exponent": args.gain_exponent}  # fmt: skip
    own = {"activation": c["activation"], "gain": c["activation_gain"],
           "gain_exponent": c["gain_exponent"]}  # fmt: skip
    for name, value in given.items():
        if value is not None and value != own[name]:
            raise InvalidInput(
                f"{value!r} differs from trial {trial.id}'s {own[name]!r}; leave it out",
                field=name,
            )
    if args.uncentered and c["norm"] != "layer_scale":
        raise InvalidInput(f"trial {trial.id} has norm {c['norm']!r}", field="uncentered")
    gain, cov, variances = theory_inputs(c, gram, moments)
    off = [f"{f}={c.get(f)}" for f, ok in THEORY_SETTING.items() if c.get(f) not in ok]
    return {
        "trial": trial.id,
        "sweep": trial.sweep_id,
        "activation": c["activation"],
        "depth": c["depth"],
        "gain": gain,
        "activation_gain": c["activation_gain"],
        "init_gain": c["init_gain"],
        "init": c["init"],
        "norm": c["norm"],
        "gain_exponent": c["gain_exponent"],
        "centered": c["norm"] != "layer_scale",
        "gram": cov,
        "input_variances": variances,
        "outside_theorem": off,  # the theorem assumes THEORY_SETTING; this trial has these
    }


def _prediction(args: argparse.Namespace, trial: dict | None = None) -> dict | None:
    from service import theory
    from service.isometry import isometry_gap

    if trial is not None:
        depth = args.depth or trial["depth"]
        kw = {"gain": trial["gain"], "gain_exponent": trial["gain_exponent"]}
        gaps = theory.mean_field_gaps(
            trial["activation"], depth, trial["gram"], **kw, stage=args.stage,
            centered=trial["centered"], input_variances=trial["input_variances"],
        )  # fmt: skip
        return {
            "depth": depth,
            "stage": args.stage,
            "centered": trial["centered"],
            "gain_exponent": trial["gain_exponent"],
            "gains": theory.layer_gains(trial["gain"], trial["gain_exponent"], depth),
            "input_gap": isometry_gap(theory.unit_gram(trial["gram"])),
            "gaps": gaps,
        }
    if args.depth is None:
        if args.input_gram or args.inputs:
            raise InvalidInput("an input Gram needs --depth L", field="depth")
        return None
    if args.input_gram:
        gram = load_matrix(args.input_gram, "input_gram")
    elif args.inputs:
        gram = theory.cosine_gram(load_matrix(args.inputs, "inputs"))
    else:
        raise InvalidInput("--depth needs --input-gram FILE or --inputs FILE", field="input_gram")
    kw = {"gain": args.gain, "gain_exponent": args.gain_exponent, "stage": args.stage}
    gaps = theory.mean_field_gaps(
        args.activation, args.depth, gram, **kw, centered=not args.uncentered
    )
    return {
        "depth": args.depth,
        "stage": args.stage,
        "centered": not args.uncentered,
        "gain_exponent": args.gain_exponent,
        "gains": theory.layer_gains(args.gain, args.gain_exponent, args.depth),
        "input_gap": isometry_gap(theory.unit_gram(gram)),
        "gaps": gaps,
    }


def run_theory(args: argparse.Namespace) -> int:
    from service import theory
    from service.jsonfmt import dumps

    if args.trial is None:  # --trial's own gains unless given
        args.gain = 1.0 if args.gain is None else args.gain
        args.gain_exponent = 0.0 if args.gain_exponent is None else args.gain_exponent
    if args.activation == "predict" or args.overrides:
        return run_predict(args)
    if args.list or args.activation == "list":
        rows = theory.registry_summary(args.gain, args.terms)
        if args.json:
            print(dumps({"data": rows, "count": len(rows)}))  # plain print: rich wraps lines
        else:
            out.print(_registry_table(rows))
        return 0
    trial = _trial_inputs(args) if args.trial is not None else None
    if trial is None and not args.activation:
        raise CommandError("name an activation, or use --list (or --trial ID)", code=2)
    name = trial["activation"] if trial else args.activation
    summary = theory.activation_summary(name, trial["gain"] if trial else args.gain, args.terms)
    summary["coefficients"] = shown_coefficients(summary["coefficients"], summary["moments"])
    prediction = _prediction(args, trial)
    if trial is not None:
        summary["trial"] = {k: v for k, v in trial.items()
                            if k not in ("gram", "input_variances")}  # fmt: skip
    if prediction is not None:
        summary["mean_field"] = prediction
    if args.json:
        print(dumps(summary))
        return 0
    if trial is not None:
        out.print(_trial_text(summary["trial"]))
    out.print(_summary_text(summary))
    out.print(_coefficient_table(summary["coefficients"]))
    if prediction is not None:
        out.print(_gap_table(prediction, summary["kappa_prime0"]))
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """`isosweep theory predict --set …`: service.theory.predict of one trial config, on the
    --inputs batch if given (else orthonormal unit-RMS inputs); `--trial ID`: of a stored trial,
    on its stored input kernel (the prediction theory_overlay draws beside its measurement)."""
    from service import theory
    from service.jsonfmt import dumps

    if args.input_gram is not None:
        raise InvalidInput("--input-gram does not apply to predict", field="input_gram")
    if args.trial is not None:
        config, p = _stored_prediction(args)
    else:
        from api.cli.common import parse_overrides
        from service.config import parse_trial_config

        config = parse_trial_config(parse_overrides(args.overrides))
        inputs = load_matrix(args.inputs, "inputs") if args.inputs else None
        p = theory.predict(config, inputs, samples=args.samples)
    metrics = {k: v for k, v in p.items() if k not in ("unpredicted", "notes")}
    if args.json:
        print(dumps({"config": config.model_dump(), "layers": list(range(1, config.depth + 1)),
                     "metrics": metrics, "unpredicted": p["unpredicted"],
                     "notes": p["notes"]}))  # fmt: skip
        return 0
    from rich.table import Table

    c = config
    t = Table(
        title=f"mean-field prediction: {c.model}, norm {c.norm}, order {c.order}, "
        f"{c.activation}, depth {c.depth}, n {c.batch_size}"
    )
    t.add_column("ℓ", justify="right")
    for k in metrics:
        t.add_column(escape(k), justify="right")
    for i in range(config.depth):
        t.add_row(str(i + 1), *(f"{metrics[k][i]:.6g}" for k in metrics))
    out.print(t)
    for k, v in p["notes"].items():
        out.print(f"{k}: {escape(str(v))}")
    for k, why in p["unpredicted"].items():
        out.print(f"[yellow]not predicted[/] {escape(k)}: {escape(why)}")
    return 0


def _stored_prediction(args: argparse.Namespace):
    """(config, prediction) of `theory predict --trial ID`: what the overlay predicts for the
    trial (service.plots.overlay.stored_prediction: its config on its stored input kernel).

    Raises:
        InvalidInput: --set or --inputs beside --trial, or a trial without a stored input Gram.
        NotFound: no trial with this id.
    """
    from api.cli.run import open_store
    from service.config import parse_trial_config
    from service.plots.overlay import stored_prediction

    for flag in ("overrides", "inputs"):
        if getattr(args, flag):
            raise InvalidInput(
                f"--{'set' if flag == 'overrides' else flag} does not apply with --trial "
                "(the trial's own config and stored inputs are predicted)",
                field=flag,
            )
    store = open_store(args.database_url)
    try:
        trial = store.get_trial(args.trial)
        prediction = stored_prediction(store, trial, samples=args.samples)
    finally:
        store.close()
    if prediction is None:
        raise InvalidInput(
            f"trial {trial.id} has no input Gram stored yet (it is recorded with epoch 0)",
            field="trial",
        )
    return parse_trial_config(dict(trial.config)), prediction


def shown_coefficients(coefficients: list[float], moments: dict[str, float]) -> list[float]:
    """cₖ with those below the quadrature's accuracy, |cₖ| < COEFFICIENT_ACCURACY·‖σ‖
    (‖σ‖ = √E σ(αX)²), set to 0.0: rounding, not a coefficient."""
    scale = float(np.sqrt(moments["mean_square"]))
    floor = COEFFICIENT_ACCURACY * scale if np.isfinite(scale) else 0.0
    return [0.0 if abs(c) < floor else c for c in coefficients]


# ------------------------------------------------------------------------------------ rendering


def _trial_text(t: dict) -> str:
    lines = [
        f"[bold]trial {t['trial']}[/] of sweep {t['sweep']}: {t['activation']}, depth "
        f"{t['depth']}, norm {escape(str(t['norm']))}, init {escape(str(t['init']))}",
        f"gain α·g·√s = {t['gain']:.6g} (α = {t['activation_gain']:g}, g = {t['init_gain']:g}), "
        f"gain exponent p = {t['gain_exponent']:g}; the stored input Gram and moments",
    ]
    if t["outside_theorem"]:
        lines.append(
            "[yellow]the theorem assumes norm layer/layer_scale, order act_norm; this trial has "
            + escape(", ".join(t["outside_theorem"]))
            + "[/]"
        )
    return "\n".join(lines)


def _registry_table(rows: list[dict]):
    from rich.table import Table

    t = Table(title=f"activations at gain α = {rows[0]['gain']:g}")
    for col in ("name", "σ(x)", "params", "β", "κ′(0) = 2 − β"):
        t.add_column(col, justify="right" if col[0] in "βκ" else "left")
    for r in rows:
        params = ", ".join(f"{k}={v:g}" for k, v in r["params"].items())
        beta, kp0 = f"{r['beta']:.10f}", f"{r['kappa_prime0']:.10f}"
        t.add_row(r["name"], escape(r["formula"]), escape(params), beta, kp0)
    return t


def _summary_text(s: dict) -> str:
    params = ", ".join(f"{k} = {v:g}" for k, v in s["params"].items())
    lines = [
        f"[bold]{s['name']}[/]  σ(x) = {escape(s['formula'])}"
        + (f"  ({params})" if params else ""),
        f"gain α = {s['gain']:g}"
        + ("  (positively homogeneous: β and κ do not depend on α)" if s["homogeneous"] else ""),
        f"β = 2 − c₁²/Σ_{{k≥1}} cₖ² = [bold]{s['beta']:.12f}[/]",
        f"κ′(0) = 2 − β = {s['kappa_prime0']:.12f}",
    ]
    if s["breakpoints"]:
        lines.append("kinks/jumps of σ at x = " + ", ".join(f"{b:g}" for b in s["breakpoints"]))
    return "\n".join(lines)


def _coefficient_table(coefficients: list[float]):
    from rich.table import Table

    t = Table(title="Hermite coefficients cₖ (basis Heₖ/√k!)")
    t.add_column("k", justify="right")
    t.add_column("cₖ", justify="right")
    for k, c in enumerate(coefficients):
        t.add_row(str(k), f"{c: .12e}" if c != 0.0 else "0")
    return t


def _gap_table(p: dict, kp0: float):
    from rich.table import Table

    t = Table(
        title=f"mean-field isometry gap ({p['stage']} output), input gap {p['input_gap']:.6g}; "
        f"near isometry gap ratio → κ′(0)² = {kp0**2:.6f}"
    )
    for col in ("ℓ", "α_ℓ", "gap", "gap_ℓ/gap_ℓ₋₁"):
        t.add_column(col, justify="right")
    prev = p["input_gap"]
    for ell, (a, g) in enumerate(zip(p["gains"], p["gaps"], strict=True), start=1):
        ratio = g / prev if prev > 0 and np.isfinite(prev) else float("nan")
        t.add_row(str(ell), f"{a:.6g}", f"{g:.8g}", f"{ratio:.6f}")
        prev = g
    return t
