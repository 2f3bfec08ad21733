"""The submit-time dataset check (service/datasets.py): a sweep whose torchvision set is neither
under Settings.data_dir nor downloadable is refused naming the directory and the files; the
files it looks for are the ones torchvision reads, so what it accepts the engine loads."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from service import datasets
from service.config import DATASET_SHAPES
from service.errors import InvalidInput
from service.settings import Settings, get_settings
from service.spec import parse_spec
from service.store import Store


def _writers():
    """tests/workers/test_data.py's writers of the real on-disk formats (idx-ubyte, pickled
    CIFAR batches), loaded by path: that directory is not a package."""
    path = Path(__file__).resolve().parents[1] / "workers" / "test_data.py"
    spec = importlib.util.spec_from_file_location("_data_writers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_file_lists_are_torchvisions():
    """Each set's files are the ones torchvision's class reads, in its layout under the root."""
    from torchvision import datasets as tv

    root = Path("/r")
    for name, cls in (("cifar10", tv.CIFAR10), ("cifar100", tv.CIFAR100)):
        names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
        want = [root / cls.base_folder / f for f in names]
        assert datasets.expected_files(name, root) == want, name
    for name, cls in (("mnist", tv.MNIST), ("fashion_mnist", tv.FashionMNIST)):
        names = [os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources]
        want = [root / cls.__name__ / "raw" / f for f in names]
        assert datasets.expected_files(name, root) == want, name
    assert set(datasets.TORCHVISION_FILES) | set(datasets.OFFLINE) == set(DATASET_SHAPES)


def test_offline_sets_are_always_available(tmp_path):
    settings = Settings(data_dir=tmp_path / "nothing")
    datasets.check_datasets(["digits", "gaussian"], settings)  # no error, no files


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100"])
def test_missing_set_is_refused_naming_directory_and_files(tmp_path, name):
    settings = Settings(data_dir=tmp_path / "data")
    with pytest.raises(InvalidInput) as exc:
        datasets.check_datasets(["digits", name], settings)
    assert exc.value.field == "parameters.dataset"
    msg = exc.value.message
    assert str(tmp_path / "data") in msg and "ISOSWEEP_ALLOW_DOWNLOAD=true" in msg
    for f in datasets.TORCHVISION_FILES[name]:
        assert f in msg
    # allowed to download: the trial will fetch it, nothing to refuse now
    datasets.check_datasets([name], Settings(data_dir=tmp_path / "data", allow_download=True))


def test_a_partial_set_names_only_the_missing_file(tmp_path):
    w = _writers()
    w.write_mnist(tmp_path, "MNIST")
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(InvalidInput) as exc:
        datasets.check_datasets(["mnist"], Settings(data_dir=tmp_path))
    assert "missing MNIST/raw/t10k-labels-idx1-ubyte." in exc.value.message
    assert "train-images" not in exc.value.message


def test_accepted_sets_are_the_ones_the_engine_reads(tmp_path, monkeypatch):
    """Tiny files in the real formats: the check passes, and workers/data.py loads them from the
    same directory through torchvision."""
    from torchvision import datasets as tv

    from workers import data

    monkeypatch.setattr(data, "_CACHE", {})
    w = _writers()
    w.write_mnist(tmp_path, "MNIST")
    w.write_cifar(tmp_path, tv.CIFAR10, monkeypatch)
    settings = Settings(data_dir=tmp_path)
    datasets.check_datasets(["mnist", "cifar10", "digits"], settings)
    assert data.load_dataset("mnist", settings.data_dir, download=False).X_train.shape[1] == 784
    assert data.load_dataset("cifar10", settings.data_dir, download=False).X_test.shape[1] == 3072


def test_store_refuses_at_create_and_writes_nothing(tmp_path, database_url):
    settings = Settings(database_url=database_url, data_dir=tmp_path / "empty")
    body = {"name": "m", "parameters": {"dataset": ["digits", "mnist"], "epochs": 0}}
    with Store(database_url, settings=settings) as store:
        with pytest.raises(InvalidInput, match="MNIST/raw/train-images-idx3-ubyte"):
            store.create_sweep(parse_spec(body, settings=settings))
        assert store.list_sweeps()[1] == 0
        _writers().write_mnist(tmp_path / "empty", "MNIST")
        assert store.create_sweep(parse_spec(body, settings=settings)).n_trials == 2


def test_post_sweeps_is_422_naming_directory_and_files(tmp_path, database_url):
    """The filed defect: `dataset: cifar10` without the files passed validation and failed when
    its trials ran (each retried). Now the POST is refused with the directory and the files."""
    import httpx

    from api.app import create_app
    from api.server import ServerThread

    settings = Settings(database_url=database_url, data_dir=tmp_path / "lab")
    store = Store(database_url, settings=settings)
    server = ServerThread(create_app(settings, store=store)).start()
    try:
        with httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as client:
            body = {"name": "c", "parameters": {"dataset": "cifar10", "epochs": 0}}
            r = client.post("/sweeps", json=body)
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["field"] == "parameters.dataset"
            assert str(tmp_path / "lab") in err["message"]
            assert "cifar-10-batches-py/data_batch_1" in err["message"]
            assert "cifar-10-batches-py/test_batch" in err["message"]
            assert client.get("/sweeps").json()["count"] == 0
    finally:
        server.stop()
        store.close()


def test_data_dir_is_absolute_and_one_place(tmp_path, monkeypatch):
    """The filed defect: the default `data` was relative, so processes started in different
    directories looked in different places. Relative values resolve against the working
    directory at load; the default is under the user's data home."""
    monkeypatch.delenv("ISOSWEEP_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.chdir(a)
    in_a = Settings().data_dir
    monkeypatch.chdir(b)
    assert Settings().data_dir == in_a == tmp_path / "xdg" / "isosweep" / "data"
    monkeypatch.setenv("ISOSWEEP_DATA_DIR", "rel")
    assert Settings().data_dir == b / "rel" and Settings().data_dir.is_absolute()
    monkeypatch.setenv("ISOSWEEP_DATA_DIR", "~/sets")
    assert Settings().data_dir == Path.home() / "sets"
    get_settings.cache_clear()
