"""Datasets: the offline sets, and the torchvision sets read from tiny files in their real formats
through torchvision's own classes."""

import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import datasets

from service.errors import DataUnavailable, InvalidInput
from workers import data


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(data, "_CACHE", {})


# --- writers of the real on-disk formats -------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    """The idx-ubyte format (LeCun): magic 0x00 0x00 0x08 ndim, big-endian int32 dims, uint8s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, n_train=30, n_test=12, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    for name, a in arrays.items():
        write_idx(root / folder / "raw" / name, a)
    return arrays


def write_cifar(root: Path, cls, monkeypatch, n_per_batch=8, n_classes=10, seed=0):
    """Pickled batch dicts (data: (N, 3072) uint8 in CHW order) and the meta file; torchvision
    then checks each file's md5 against the class's list, which we point at what we wrote."""
    rng = np.random.default_rng(seed)
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "labels" if cls is datasets.CIFAR10 else "fine_labels"
    written = {}

    def dump(name, obj):
        (folder / name).write_bytes(pickle.dumps(obj))
        return [name, hashlib.md5((folder / name).read_bytes()).hexdigest()]

    def batch(name):
        x = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        y = rng.integers(0, n_classes, n_per_batch).tolist()
        written[name] = (x, y)
        return dump(name, {"data": x, label_key: y})

    train = [batch(name) for name, _ in cls.train_list]
    test = [batch(name) for name, _ in cls.test_list]
    _, meta_md5 = dump(cls.meta["filename"], {cls.meta["key"]: [f"c{i}" for i in range(n_classes)]})
    monkeypatch.setattr(cls, "train_list", train)
    monkeypatch.setattr(cls, "test_list", test)
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": meta_md5})
    return written


# --- torchvision sets --------------------------------------------------------------------------


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_family_from_idx_files(tmp_path, name, folder):
    arrays = write_mnist(tmp_path, folder)
    ds = data.load_dataset(name, tmp_path, download=False)
    assert ds.X_train.shape == (30, 784) and ds.X_test.shape == (12, 784)
    assert ds.X_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    np.testing.assert_array_equal(ds.y_train.numpy(), arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])
    # standardized with the training statistics, pixel order kept (row-major 28 × 28)
    raw = arrays["train-images-idx3-ubyte"].reshape(30, -1) / 255.0
    expected = (raw - raw.mean(0)) / raw.std(0)
    np.testing.assert_allclose(ds.X_train.numpy(), expected, rtol=1e-5, atol=1e-5)
    raw_test = arrays["t10k-images-idx3-ubyte"].reshape(12, -1) / 255.0
    np.testing.assert_allclose(
        ds.X_test.numpy(), (raw_test - raw.mean(0)) / raw.std(0), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "name, cls, n_classes",
    [("cifar10", datasets.CIFAR10, 10), ("cifar100", datasets.CIFAR100, 100)],
)
def test_cifar_from_pickled_batches_with_md5_check(tmp_path, monkeypatch, name, cls, n_classes):
    written = write_cifar(tmp_path, cls, monkeypatch, n_classes=n_classes)
    ds = data.load_dataset(name, tmp_path, download=False)
    n_train = 8 * len(cls.train_list)
    assert ds.X_train.shape == (n_train, 3072) and ds.X_test.shape == (8, 3072)
    train_x = np.concatenate([written[n][0] for n, _ in cls.train_list]) / 255.0
    train_y = [y for n, _ in cls.train_list for y in written[n][1]]
    np.testing.assert_array_equal(ds.y_train.numpy(), train_y)
    # channels-first flattening, as stored in the batches (R plane, G plane, B plane)
    expected = (train_x - train_x.mean(0)) / train_x.std(0)
    np.testing.assert_allclose(ds.X_train.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_cifar_corrupted_file_fails_md5_and_is_unavailable(tmp_path, monkeypatch):
    write_cifar(tmp_path, datasets.CIFAR10, monkeypatch)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataUnavailable, match="data_batch_3"):
        data.load_dataset("cifar10", tmp_path, download=False)


@pytest.mark.parametrize(
    "name, files",
    [
        (
            "cifar10",
            [
                "cifar-10-batches-py/data_batch_1",
                "cifar-10-batches-py/test_batch",
                "cifar-10-batches-py/batches.meta",
            ],
        ),
        ("cifar100", ["cifar-100-python/train", "cifar-100-python/meta"]),
        ("mnist", ["MNIST/raw/train-images-idx3-ubyte", "MNIST/raw/t10k-labels-idx1-ubyte"]),
        ("fashion_mnist", ["FashionMNIST/raw/train-labels-idx1-ubyte"]),
    ],
)
def test_missing_files_name_directory_and_files(tmp_path, name, files):
    with pytest.raises(DataUnavailable) as exc:
        data.load_dataset(name, tmp_path / "nowhere", download=False)
    msg = exc.value.message
    assert str(tmp_path / "nowhere") in msg and "ISOSWEEP_DATA_DIR" in msg
    for f in files:
        assert f in msg


def test_failed_download_is_unavailable(tmp_path, monkeypatch):
    from urllib.error import URLError

    def offline(self):
        raise URLError("no network")

    monkeypatch.setattr(datasets.MNIST, "download", offline)
    with pytest.raises(DataUnavailable, match=r"download failed: .*no network"):
        data.load_dataset("mnist", tmp_path, download=True)


@pytest.mark.parametrize("allow", [False, True])
def test_downloads_follow_the_allow_download_setting(tmp_path, monkeypatch, allow):
    """Without `download=`, workers/data.py tries a download exactly when the settings allow
    one (ISOSWEEP_ALLOW_DOWNLOAD), the setting the submit check uses."""
    from service.settings import get_settings

    tried = []
    monkeypatch.setattr(datasets.MNIST, "download", lambda self: tried.append(self.root))
    monkeypatch.setenv("ISOSWEEP_ALLOW_DOWNLOAD", str(allow).lower())
    get_settings.cache_clear()
    try:
        with pytest.raises(DataUnavailable, match="ISOSWEEP_ALLOW_DOWNLOAD=true"):
            data.load_dataset("mnist", tmp_path)
    finally:
        get_settings.cache_clear()
    assert tried == ([str(tmp_path)] if allow else [])


def test_default_root_is_the_settings_data_dir(tmp_path, monkeypatch):
    from service.settings import get_settings

    write_mnist(tmp_path, "MNIST")
    monkeypatch.setenv("ISOSWEEP_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        assert data.load_dataset("mnist", download=False).X_train.shape == (30, 784)
    finally:
        get_settings.cache_clear()


def test_loaded_sets_are_cached_per_process(tmp_path):
    write_mnist(tmp_path, "MNIST")
    a = data.load_dataset("mnist", tmp_path, download=False)
    for f in (tmp_path / "MNIST" / "raw").iterdir():
        f.unlink()  # a second load must not read the disk
    assert data.load_dataset("mnist", tmp_path, download=False) is a


# --- offline sets ------------------------------------------------------------------------------


def test_digits_fixed_split_standardized():
    ds = data.load_dataset("digits")
    assert ds.X_train.shape == (1437, 64) and ds.X_test.shape == (360, 64)
    assert set(ds.y_train.tolist()) == set(range(10))
    torch.testing.assert_close(ds.X_train.mean(0), torch.zeros(64), atol=1e-5, rtol=0)
    sd = ds.X_train.std(0, correction=0)
    unit = (sd - 1).abs() < 1e-5
    assert int(unit.sum()) >= 55  # the border pixels are (nearly) constant: floored, std < 1
    assert (sd[~unit] < 1).all()
    assert torch.isfinite(ds.X_test).all() and ds.X_test.abs().max() < 1e3  # floored std
    data._CACHE.clear()
    again = data.load_dataset("digits")
    assert torch.equal(again.X_train, ds.X_train) and torch.equal(again.y_test, ds.y_test)


def test_digits_is_scikit_learns_split_read_without_importing_it():
    """The pinned split (workers/digits_split.py) is the one train_test_split made, row for row,
    so digits records are unchanged; and scikit-learn is not imported to read it (a subprocess:
    this process has imported it already)."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    raw = data._digits()
    for got, want in zip(raw, (Xtr, ytr, Xte, yte), strict=True):
        assert got.dtype == torch.from_numpy(want).dtype
        np.testing.assert_array_equal(got.numpy(), want)
    code = "import sys; from workers import data; data._digits(); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gaussian_is_fixed_balanced_and_linearly_labelled():
    ds = data.load_dataset("gaussian")
    assert ds.X_train.shape == (4000, 100) and ds.X_test.shape == (1000, 100)
    counts = torch.bincount(ds.y_train, minlength=10)
    assert counts.min() > 200  # 400 expected per class
    # labels come from a linear teacher: least squares on one-hot targets separates them well
    X = torch.cat([ds.X_train.double(), torch.ones(4000, 1, dtype=torch.float64)], 1)
    Y = torch.nn.functional.one_hot(ds.y_train, 10).double()
    B = torch.linalg.lstsq(X, Y).solution
    acc = (
        (torch.cat([ds.X_test.double(), torch.ones(1000, 1, dtype=torch.float64)], 1) @ B)
        .argmax(1)
        .eq(ds.y_test)
        .double()
        .mean()
    )
    assert acc > 0.6  # chance is 0.1
    data._CACHE.clear()
    assert torch.equal(data.load_dataset("gaussian").X_train, ds.X_train)


def test_subset_is_seeded():
    ds = data.load_dataset("digits")
    a = data.subset(ds, 100, torch.Generator().manual_seed(0))
    b = data.subset(ds, 100, torch.Generator().manual_seed(0))
    c = data.subset(ds, 100, torch.Generator().manual_seed(1))
    assert a.X_train.shape == (100, 64) and torch.equal(a.X_train, b.X_train)
    assert not torch.equal(a.X_train, c.X_train)
    assert a.X_test is ds.X_test


def test_standardize_floors_the_std():
    Xtr = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    Xte = torch.tensor([[1.0, 2.0]])
    ds = data.standardize(Xtr, torch.tensor([0, 1]), Xte, torch.tensor([1]))
    # feature 0 is constant: std floored at 1% of the mean std (0.5) → the test value is 200
    assert ds.X_test[0, 0] == pytest.approx(1.0 / (0.01 * 0.5))
    assert ds.X_train[:, 1].tolist() == [-1.0, 1.0]


def test_unknown_dataset_names_allowed():
    with pytest.raises(InvalidInput, match=r"dataset.*allowed: cifar10"):
        data.load_dataset("imagenet")
