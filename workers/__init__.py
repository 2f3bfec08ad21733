"""The compute side (torch, Ray): the model families (workers/models: mlp, resmlp, cnn,
transformer, a lab's registered module), their measurements (metrics, token metrics, gaps, the
structure tracker, the input–output Jacobian), the datasets, training one trial or a pack of
them, and the sweep driver on Ray Tune."""

import os

# Read by Ray when it is imported (this package runs before any workers.* module imports it):
# every Ray listener stays on loopback, and Tune writes no CSV/JSON/TensorBoard files of its own
# (StoreCallback is the writer); the old output engine honours verbose=0.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
