"""Adaptive search and early stopping of sweeps (issue 15; docs/api.md, "Adaptive search" and
"Early stopping"): `halving` (asynchronous successive halving) and `tpe` (Optuna's TPE through
ask/tell, the store the source of truth)."""
