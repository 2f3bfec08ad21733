"""Which datasets a sweep can use here, decided at submit: a torchvision set must be on disk
under `Settings.data_dir`, or downloads must be allowed (`Settings.allow_download`).

No torch or torchvision here: the files are those torchvision's own classes read (workers/data.py
loads them through torchvision.datasets.CIFAR10, CIFAR100, MNIST and FashionMNIST), laid out as
torchvision lays them under the root; tests/service/test_datasets.py checks the lists against
torchvision's class attributes. Presence only: torchvision checks CIFAR's md5 sums when a trial
reads the files (a corrupted file still fails there, as DataUnavailable).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from service.errors import InvalidInput
from service.settings import Settings

OFFLINE = ("digits", "gaussian")  # bundled with scikit-learn / synthetic: always available


IDX_KINDS = ("images-idx3-ubyte", "labels-idx1-ubyte")


def _mnist_family(folder: str) -> tuple[str, ...]:
    """torchvision's MNIST layout: the decompressed idx files under <root>/<Class>/raw/."""
    names = [f"{part}-{kind}" for part in ("train", "t10k") for kind in IDX_KINDS]
    return tuple(f"{folder}/raw/{n}" for n in names)


CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR100_FOLDER = "cifar-100-python"
# dataset → the files (relative to data_dir) torchvision reads it from
TORCHVISION_FILES: dict[str, tuple[str, ...]] = {
    "cifar10": tuple(
        f"{CIFAR10_FOLDER}/{n}"
        for n in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")
    ),
    "cifar100": tuple(f"{CIFAR100_FOLDER}/{n}" for n in ("train", "test", "meta")),
    "mnist": _mnist_family("MNIST"),
    "fashion_mnist": _mnist_family("FashionMNIST"),
}
# Where to get each set's files by hand (what torchvision downloads).
SOURCES = {
    "cifar10": "extract cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html",
    "cifar100": "extract cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html",
    "mnist": "decompress the four idx .gz files of the MNIST database",
    "fashion_mnist": "decompress the four idx .gz files of Fashion-MNIST",
}


def expected_files(name: str, root: str | Path) -> list[Path]:
    """The files a torchvision set `name` is read from under `root`."""
    return [Path(root) / f for f in TORCHVISION_FILES[name]]


def missing_files(name: str, root: str | Path) -> list[str]:
    """The files of `name` absent under `root`, relative to it; [] for the offline sets."""
    if name in OFFLINE:
        return []
    return [f for f in TORCHVISION_FILES[name] if not (Path(root) / f).is_file()]


def unavailable_message(name: str, root: str | Path, missing: list[str]) -> str:
    """What is missing where, and the two ways out."""
    return (
        f"dataset {name!r} is not available in {root} (ISOSWEEP_DATA_DIR): missing "
        f"{', '.join(missing)}. Put the files there ({SOURCES[name]}, keeping torchvision's "
        "layout shown), or set ISOSWEEP_ALLOW_DOWNLOAD=true to let trials download them"
    )


def check_datasets(names: Iterable[str], settings: Settings) -> None:
    """Refuse a sweep using a dataset that its trials could not read.

    Raises:
        InvalidInput: field `parameters.dataset`; names the directory and the missing files.
    """
    if settings.allow_download:
        return
    for name in sorted(set(names)):
        missing = missing_files(name, settings.data_dir)
        if missing:
            raise InvalidInput(
                unavailable_message(name, settings.data_dir, missing), field="parameters.dataset"
            )
