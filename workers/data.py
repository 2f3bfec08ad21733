"""Datasets as whole tensors: inputs flattened and standardized, labels as int64.

cifar10, cifar100, mnist and fashion_mnist are read through torchvision's own dataset classes
from `data_dir` (downloaded there first when the files are missing and `Settings.allow_download`
is on; the files are listed in service.datasets, which refuses a sweep at submit when they are
absent); `digits` (scikit-learn's bundled 8×8 images) and `gaussian` (synthetic) need no files.
torchvision and scikit-learn are not imported for the offline sets. A loaded set is cached for
the life of the process, so several trials in one worker read it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from service.config import DATASET_SHAPES
from service.datasets import expected_files, missing_files, unavailable_message
from service.errors import DataUnavailable, InvalidInput

TORCHVISION_CLASSES = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
}
GAUSSIAN_SEED = 20230529  # the synthetic set is the same for every trial and machine
GAUSSIAN_TRAIN, GAUSSIAN_TEST = 4000, 1000
DIGITS_TEST_FRACTION = 0.2
STD_FLOOR = 1e-2  # × the mean feature std: constant pixels (MNIST's border) are not blown up

_CACHE: dict[tuple[str, str | None], Dataset] = {}


class Dataset(NamedTuple):
    X_train: Tensor  # (N, D) float32, standardized with the training statistics
    y_train: Tensor  # (N,) int64
    X_test: Tensor  # (M, D) float32
    y_test: Tensor  # (M,) int64


def load_dataset(
    name: str, data_dir: str | Path | None = None, *, download: bool | None = None
) -> Dataset:
    """The whole dataset `name` as tensors on the CPU (cached per process; do not modify them).

    Args:
        name: one of service.config.DATASET_SHAPES.
        data_dir: root of the torchvision sets; default `Settings.data_dir` (ISOSWEEP_DATA_DIR).
        download: try to download a torchvision set whose files are missing; default
            `Settings.allow_download` (ISOSWEEP_ALLOW_DOWNLOAD).

    Raises:
        InvalidInput: unknown name.
        DataUnavailable: the files are missing and could not be downloaded; the message names the
            directory and the files expected in it.
    """
    if name not in DATASET_SHAPES:
        raise InvalidInput(f"unknown dataset {name!r}", field="dataset", allowed=DATASET_SHAPES)
    root = None
    if name in TORCHVISION_CLASSES:
        from service.settings import get_settings

        data_dir = get_settings().data_dir if data_dir is None else data_dir
        download = get_settings().allow_download if download is None else download
        root = str(Path(data_dir).expanduser().resolve())
    key = (name, root)
    if key not in _CACHE:
        if name == "digits":
            raw = _digits()
        elif name == "gaussian":
            raw = _gaussian()
        else:
            raw = _torchvision(name, root, download)  # type: ignore[arg-type]
        _CACHE[key] = standardize(*raw)
    return _CACHE[key]


def standardize(X_train: Tensor, y_train: Tensor, X_test: Tensor, y_test: Tensor) -> Dataset:
    """Flatten, then per feature subtract the training mean and divide by the training std,
    floored at STD_FLOOR × the mean std so that a (nearly) constant feature stays small."""
    Xtr = X_train.reshape(len(X_train), -1).to(torch.float64)
    Xte = X_test.reshape(len(X_test), -1).to(torch.float64)
    mu = Xtr.mean(dim=0)
    sd = Xtr.std(dim=0, correction=0)
    sd = sd.clamp_min(STD_FLOOR * float(sd.mean()) or 1.0)
    return Dataset(
        ((Xtr - mu) / sd).to(torch.float32),
        y_train.to(torch.int64),
        ((Xte - mu) / sd).to(torch.float32),
        y_test.to(torch.int64),
    )


def normalize_inputs(X: Tensor, how: str) -> Tensor:
    """TrialConfig.input_norm applied to (N, D) inputs: "none" returns X itself; "unit_rms"
    scales each sample to unit root mean square, x_i ↦ x_i / √(‖x_i‖²/D) (as Joudaki et al.
    2023's code feeds its MLPs), computed in float64 and returned in X's dtype. An all-zero sample
    stays zero.
    """
    if how == "none":
        return X
    if how != "unit_rms":
        raise InvalidInput(
            f"unknown input_norm {how!r}", field="input_norm", allowed=("none", "unit_rms")
        )
    x = X.to(torch.float64)
    rms = x.pow(2).mean(dim=1, keepdim=True).sqrt()
    return (x / torch.where(rms > 0, rms, 1.0)).to(X.dtype)


def subset(data: Dataset, k: int, generator: torch.Generator) -> Dataset:
    """k training samples drawn without replacement with `generator`; the test set is kept."""
    if k >= len(data.X_train):
        return data
    idx = torch.randperm(len(data.X_train), generator=generator)[:k]
    return Dataset(data.X_train[idx], data.y_train[idx], data.X_test, data.y_test)


def _digits() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """scikit-learn's 1797 8×8 digit images, a fixed stratified 80/20 split (workers/digits_split).

    Read from scikit-learn's bundled CSV (what `load_digits` reads) without importing
    scikit-learn, whose import costs more than the rest of an init-only trial."""
    import gzip
    import importlib.util

    from workers.digits_split import digits_split

    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailable("dataset 'digits' needs scikit-learn installed (its bundled CSV)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    X, y = data[:, :-1], data[:, -1].astype(np.int64)
    train, test = digits_split()
    return tuple(torch.from_numpy(a[i]) for a, i in ((X, train), (y, train), (X, test), (y, test)))  # type: ignore[return-value]


def _gaussian() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x ~ N(0, I_100); the label is the argmax of a fixed random linear teacher x Tᵀ, so the
    classes are balanced on average and a network can learn them."""
    d, c = DATASET_SHAPES["gaussian"]
    g = torch.Generator().manual_seed(GAUSSIAN_SEED)
    T = torch.randn(c, d, generator=g, dtype=torch.float64)  # (C, D) teacher
    X = torch.randn(GAUSSIAN_TRAIN + GAUSSIAN_TEST, d, generator=g, dtype=torch.float64)
    y = (X @ T.T).argmax(dim=1)
    n = GAUSSIAN_TRAIN
    return X[:n], y[:n], X[n:], y[n:]


def _torchvision(name: str, root: str, download: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Read with torchvision (which checks CIFAR's md5 sums); download first if missing."""
    from torchvision import datasets

    cls = getattr(datasets, TORCHVISION_CLASSES[name])
    try:
        return _read(cls, root)
    except (RuntimeError, OSError) as exc:
        reason = str(exc)
    if download:
        try:
            cls(root, train=True, download=True)
            return _read(cls, root)
        except Exception as exc:  # offline: URLError, RuntimeError, OSError, …
            reason = f"download failed: {exc}"
    missing = missing_files(name, root)
    if missing:
        raise DataUnavailable(f"{unavailable_message(name, root, missing)} — {reason.strip()}")
    files = ", ".join(str(f.relative_to(root)) for f in expected_files(name, root))
    raise DataUnavailable(
        f"dataset {name!r} is not available in {root} (ISOSWEEP_DATA_DIR): the files {files} "
        f"are there but could not be read — {reason.strip()}"
    )


def _read(cls, root: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    train, test = cls(root, train=True), cls(root, train=False)
    return (*_arrays(train), *_arrays(test))


def _arrays(ds) -> tuple[Tensor, Tensor]:
    """Images as float in [0, 1], channels first (N, C·H·W order), labels as int64."""
    X = torch.as_tensor(np.asarray(ds.data))
    if X.ndim == 4:  # CIFAR keeps (N, H, W, C)
        X = X.permute(0, 3, 1, 2)
    return X.reshape(len(X), -1).to(torch.float32) / 255.0, torch.as_tensor(ds.targets)
