"""`isosweep theory`: Hermite coefficients, isometry strength β and mean-field gap predictions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.markup import escape

from api.cli.common import CommandError, out
from service.errors import InvalidInput


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
    p.add_argument("activation", nargs="?", help="a registered activation, or `list`")
    p.add_argument("--list", action="store_true", help="every registered activation with its β")
    p.add_argument("--gain", type=float, default=1.0, help="input gain α (default 1)")
    p.add_argument("--terms", type=int, default=20, help="highest coefficient index K (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON (NaN/±inf as strings)")
    p.add_argument("--depth", type=int, help="predict the gap at blocks 1..L (needs a Gram)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--input-gram", type=Path, metavar="FILE", help="(n, n) input Gram: .npy, .csv or .json"
    )
    src.add_argument(
        "--inputs", type=Path, metavar="FILE", help="(n, d) input batch: .npy, .csv or .json"
    )
    p.add_argument("--gain-exponent", type=float, default=0.0, help="p: α_ℓ = α·ℓ^(−p) (default 0)")
    p.add_argument(
        "--stage", default="norm", help="Gram of which sub-layer: linear, act, norm (default)"
    )
    p.add_argument(
        "--uncentered", action="store_true", help="scale-only normalization (layer_scale)"
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


def _prediction(args: argparse.Namespace) -> dict | None:
    from service import theory
    from service.isometry import isometry_gap

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

    if args.list or args.activation == "list":
        rows = theory.registry_summary(args.gain, args.terms)
        if args.json:
            print(dumps({"data": rows, "count": len(rows)}))  # plain print: rich wraps lines
        else:
            out.print(_registry_table(rows))
        return 0
    if not args.activation:
        raise CommandError("name an activation, or use --list", code=2)
    summary = theory.activation_summary(args.activation, args.gain, args.terms)
    prediction = _prediction(args)
    if prediction is not None:
        summary["mean_field"] = prediction
    if args.json:
        print(dumps(summary))
        return 0
    out.print(_summary_text(summary))
    out.print(_coefficient_table(summary["coefficients"]))
    if prediction is not None:
        out.print(_gap_table(prediction, summary["kappa_prime0"]))
    return 0


# ------------------------------------------------------------------------------------ rendering


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
        t.add_row(str(k), f"{c: .12e}")
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
