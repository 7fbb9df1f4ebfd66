"""``python -m benchmarks.prepare`` against a local HTTP server (127.0.0.1, started here) that serves
fake archives in the official formats. The official checksums cannot match fake files, so each test
puts the fakes' checksums in the tables the command reads (torchvision's and the suite's)."""

from __future__ import annotations

import hashlib
import io
import socket
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torchvision.datasets
from torchvision.datasets import imagenet as tv_imagenet

from benchmarks.backbone import BackboneSpec, check_weights
from benchmarks.core.errors import UserError
from benchmarks.data.datasets import imagenet_wnid_names, load_dataset, load_zero_shot_target
from benchmarks.data.unit import dataset_unit, random_jpeg
from benchmarks.prepare import command as prepare


class ArchiveServer:
    """Serves ``files`` (name -> bytes) with range requests; a name in ``cut`` is sent half once,
    with the full Content-Length, and the connection closed (a download cut halfway)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.cut, self.requests = files, set(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests.append((name, self.headers.get("Range")))
                if name not in server.files:
                    self.send_error(404)
                    return
                data, start = server.files[name], 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if name in server.cut:
                    server.cut.discard(name)
                    body = body[: len(body) // 2]
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _tar(folder: Path, arcname: str, mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        archive.add(folder, arcname=arcname)
    return buffer.getvalue()


def _md5(blob: bytes) -> str:
    return hashlib.md5(blob).hexdigest()


@pytest.fixture
def official(tmp_path, monkeypatch):
    """Fake official archives of cifar100, imagenet_r, pets and food101 on a local server, and the
    command's checksum tables set to theirs."""
    rng = np.random.RandomState(0)
    made = tmp_path / "made"
    files = {
        "cifar-100-python.tar.gz": _tar(
            dataset_unit("cifar100").write_fake(made, 2, 1, rng), "cifar-100-python"
        ),
        "imagenet-r.tar": _tar(dataset_unit("imagenet_r").write_fake(made, 1, 1, rng), "imagenet-r", "w"),
        "food-101.tar.gz": _tar(dataset_unit("food101").write_fake(made, 1, 1, rng), "food-101"),
    }
    pets = dataset_unit("pets").write_fake(made, 1, 1, rng)
    files["images.tar.gz"] = _tar(pets / "images", "images")
    files["annotations.tar.gz"] = _tar(pets / "annotations", "annotations")
    for name in ("cifar100", "imagenet_r", "pets", "food101"):  # each unit's archives, the fakes' MD5
        unit = dataset_unit(name)
        fakes = [prepare.Archive(a.url, _md5(files[a.filename])) for a in unit.archives()]
        monkeypatch.setattr(unit, "archives", lambda fakes=fakes: fakes)
    cifar = made / "cifar-100-python"
    cifar_md5 = {name: _md5((cifar / name).read_bytes()) for name in ("train", "test", "meta")}
    monkeypatch.setattr(torchvision.datasets.CIFAR100, "train_list", [["train", cifar_md5["train"]]])
    monkeypatch.setattr(torchvision.datasets.CIFAR100, "test_list", [["test", cifar_md5["test"]]])
    monkeypatch.setattr(
        torchvision.datasets.CIFAR100,
        "meta",
        {**torchvision.datasets.CIFAR100.meta, "md5": cifar_md5["meta"]},
    )
    server = ArchiveServer(files)
    yield server
    server.close()


def run(capsys, *argv: str) -> tuple[int, str]:
    code = prepare.main(list(argv))
    return code, capsys.readouterr().err


def test_every_dataset_downloads_verifies_extracts_and_loads(official, tmp_path, capsys):
    root = tmp_path / "data"
    targets = ("cifar100", "imagenet_r", "pets", "food101")
    code, err = run(capsys, *targets, "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 0, err
    assert "cifar100: ready at" in err
    cifar = load_dataset("cifar100", root)  # its MD5 check (the fakes' sums) passes
    assert cifar.n_classes == 100 and len(cifar.train) == 200 and cifar.class_names[1] == "aquarium fish"
    assert load_dataset("imagenet_r", root, split="stratified").n_classes == 200  # the fake tar's own names
    assert load_zero_shot_target("pets", root).n_classes == 37
    assert load_zero_shot_target("food101", root).n_classes == 101
    # no staging folder, no partial download, and the downloaded archives are removed
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["archives", "cifar-100-python", "imagenet-r", "oxford-iiit-pet", "food-101"]
    )
    assert list((root / "archives").iterdir()) == []


def test_a_prepared_target_is_skipped_without_a_request(official, tmp_path, capsys):
    root = tmp_path / "data"
    assert run(capsys, "imagenet_r", "--data-root", str(root), "--mirror", official.url, "--quiet")[0] == 0
    requests = len(official.requests)
    code, err = run(capsys, "imagenet_r", "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 0 and "already prepared" in err and len(official.requests) == requests


def test_a_checksum_mismatch_extracts_nothing_and_keeps_nothing(official, tmp_path, capsys):
    root = tmp_path / "data"
    official.files["imagenet-r.tar"] = official.files["imagenet-r.tar"][:-10] + b"x" * 10
    code, err = run(capsys, "imagenet_r", "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "fails its MD5 check" in err
    assert not (root / "imagenet-r").exists()
    assert list((root / "archives").iterdir()) == []  # neither the bad archive nor a .part
    assert not list(root.glob(".prepare-*"))


def test_a_download_cut_halfway_resumes_on_a_rerun(official, tmp_path, capsys):
    root = tmp_path / "data"
    official.cut.add("food-101.tar.gz")
    code, err = run(capsys, "food101", "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "rerun to resume" in err
    part = root / "archives" / "food-101.tar.gz.part"
    size = len(official.files["food-101.tar.gz"])
    assert part.stat().st_size == size // 2 and not (root / "food-101").exists()
    listing = prepare._list(prepare.Context(root, root / "archives"))
    assert f"{size // 2} bytes of food-101.tar.gz downloaded" in listing
    code, err = run(capsys, "food101", "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 0, err
    assert official.requests[-1] == ("food-101.tar.gz", f"bytes={size // 2}-")  # resumed, not restarted
    assert load_zero_shot_target("food101", root).n_classes == 101


def test_no_network_names_the_url_and_where_to_put_the_file(official, tmp_path, capsys):
    root = tmp_path / "data"
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, err = run(
        capsys, "pets", "--data-root", str(root), "--mirror", f"http://127.0.0.1:{port}", "--quiet"
    )
    assert code == 2 and err.count("\n") == 1
    by_hand = root / "archives" / "images.tar.gz"
    assert "https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz" in err and str(by_hand) in err
    # put there by hand, the files are used without the network
    for name in ("images.tar.gz", "annotations.tar.gz"):
        (root / "archives" / name).write_bytes(official.files[name])
    code, err = run(
        capsys, "pets", "--data-root", str(root), "--mirror", f"http://127.0.0.1:{port}", "--quiet"
    )
    assert code == 0, err
    assert load_zero_shot_target("pets", root).n_classes == 37


def test_offline_every_missing_target_is_named_at_once_one_line_each(official, tmp_path, capsys):
    """A user offline learns everything that is missing from one command, not one target per try."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    root = tmp_path / "data"
    argv = ["pets", "food101", "cifar100", "--data-root", str(root), "--quiet"]
    code, err = run(capsys, *argv, "--mirror", f"http://127.0.0.1:{port}")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    for archive in ("images.tar.gz", "food-101.tar.gz", "cifar-100-python.tar.gz"):
        assert sum(archive in line for line in lines) == 1, (archive, lines)
    # one that can be prepared still is, beside the missing ones
    code, err = run(capsys, *argv, "--mirror", official.url)
    assert code == 0 and err.count("ready at") == 3


def test_the_torchvision_archives_the_units_list_are_torchvisions_own():
    """The units name torchvision's URLs and MD5s as data, so that listing them imports no torchvision;
    torchvision's classes are the source (a newer torchvision that moves a file fails here)."""
    tv = torchvision.datasets
    assert dataset_unit("cifar100").archives() == [prepare.Archive(tv.CIFAR100.url, tv.CIFAR100.tgz_md5)]
    assert dataset_unit("pets").archives() == [prepare.Archive(*r) for r in tv.OxfordIIITPet._RESOURCES]
    assert dataset_unit("food101").archives() == [prepare.Archive(tv.Food101._URL, tv.Food101._MD5)]
    sun = prepare.Archive(tv.SUN397._DATASET_URL, tv.SUN397._DATASET_MD5)
    assert dataset_unit("sun397").archives() == [sun]
    assert [a.url for a in dataset_unit("aircraft").archives()] == [tv.FGVCAircraft._URL]
    assert dataset_unit("cifar100").folder == tv.CIFAR100.base_folder


def test_the_command_line_imports_neither_torchvision_nor_open_clip():
    """``--help`` and a bad target's one line list every unit's files without the seconds that
    torchvision and open_clip take to import (the weights target imports open_clip when it runs)."""
    probe = (
        "import sys\n"
        "from benchmarks.prepare.command import main\n"
        "for argv in (['--help'], ['nosuch']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted({'torchvision', 'open_clip', 'avalanche'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_list_shows_present_missing_and_corrupt(official, tmp_path, capsys):
    root = tmp_path / "data"
    assert run(capsys, "cifar100", "--data-root", str(root), "--mirror", official.url, "--quiet")[0] == 0
    (root / "imagenet-r" / "n01443537").mkdir(parents=True)  # one of 200 wnid folders
    assert prepare.main(["--list", "--data-root", str(root)]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "| present |" in rows["cifar100"] and "| missing |" in rows["food101"]
    assert "corrupt: " in rows["imagenet_r"] and "200 wnid folders" in rows["imagenet_r"]
    with open(root / "cifar-100-python" / "test", "ab") as damaged:
        damaged.write(b"x")
    assert prepare.main(["--list", "--data-root", str(root)]) == 0
    assert "corrupt: test fails its MD5 check" in capsys.readouterr().out
    # a damaged target is replaced only when asked
    code, err = run(capsys, "cifar100", "--data-root", str(root), "--mirror", official.url, "--quiet")
    assert code == 2 and "--force" in err
    code, err = run(
        capsys, "cifar100", "--force", "--data-root", str(root), "--mirror", official.url, "--quiet"
    )
    assert code == 0 and load_dataset("cifar100", root).n_classes == 100


@pytest.mark.parametrize("argv", [["nosuch"], []])
def test_a_bad_command_line_is_one_line_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        prepare.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    valid = (
        "cifar100, imagenet_r, imagenet, pets, food101, cub200, cars196, aircraft, ucf101, "
        "objectnet, imagenet_a, tinyimagenet, sun397"
    )
    assert f"valid: {valid}, weights, all" in err or not argv


def test_an_unwritable_data_root_is_one_line_with_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "data"  # under a file: nothing can be created there
    code, err = run(capsys, "cifar100", "--data-root", str(root), "--mirror", "http://127.0.0.1:9", "--quiet")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: cannot write")


def test_weights_from_a_mirror_land_where_runs_look(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    blob = b"not really a checkpoint"
    archive = prepare.Weights().archive()
    monkeypatch.setattr(
        prepare.Weights,
        "archive",
        lambda self: prepare.Archive(archive.url, hashlib.sha256(blob).hexdigest(), "sha256"),
    )
    server = ArchiveServer({"ViT-B-16.pt": blob})
    try:
        assert "| weights | missing |" in prepare._list(prepare.Context(tmp_path, tmp_path))
        code, err = run(capsys, "weights", "--mirror", server.url, "--quiet")
    finally:
        server.close()
    assert code == 0, err
    target = tmp_path / "home" / ".cache" / "clip" / "ViT-B-16.pt"
    assert target.read_bytes() == blob
    assert check_weights(BackboneSpec("ViT-B-16-quickgelu", "openai")) == target
    target.write_bytes(b"damaged")
    assert "| weights | corrupt: " in prepare._list(prepare.Context(tmp_path, tmp_path))


def _ilsvrc_archives(folder: Path, wnids: list[str], rng) -> dict[str, bytes]:
    """Fake ILSVRC2012 archives: a devkit (meta.mat of the 1000 leaf synsets plus one inner node,
    and the val ground truth), a flat val tar, and a train tar of one tar per wnid."""
    devkit = folder / "ILSVRC2012_devkit_t12" / "data"
    devkit.mkdir(parents=True)
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "wordnet_height", "num_train_images"]
    rows = [(i + 1, w, f"name {i}, other", "", 0, 0, 1) for i, w in enumerate(wnids)]
    rows.append((len(wnids) + 1, "n00000001", "inner node", "", 3, 1, 0))
    synsets = np.array(rows, dtype=[(f, object) for f in fields])
    scipy.io.savemat(devkit / "meta.mat", {"synsets": synsets})
    order = rng.permutation(len(wnids))  # val images in an order of their own: the devkit sorts them
    (devkit / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{i + 1}\n" for i in order))
    val, train = folder / "val", folder / "train"
    val.mkdir()
    train.mkdir()
    for n, i in enumerate(order):
        random_jpeg(val / f"ILSVRC2012_val_{n + 1:08d}.JPEG", rng)
    for wnid in wnids:
        inner = folder / "inner" / wnid
        inner.mkdir(parents=True)
        random_jpeg(inner / f"{wnid}_1.JPEG", rng)
        with tarfile.open(train / f"{wnid}.tar", "w") as archive:
            archive.add(inner / f"{wnid}_1.JPEG", arcname=f"{wnid}_1.JPEG")

    def flat(directory: Path) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for path in sorted(directory.iterdir()):
                archive.add(path, arcname=path.name)
        return buffer.getvalue()

    return {
        "ILSVRC2012_devkit_t12.tar.gz": _tar(folder / "ILSVRC2012_devkit_t12", "ILSVRC2012_devkit_t12"),
        "ILSVRC2012_img_val.tar": flat(val),
        "ILSVRC2012_img_train.tar": flat(train),
    }


@pytest.mark.slow
def test_imagenet_from_ilsvrc_archives_is_sorted_by_the_devkit(tmp_path, monkeypatch, capsys):
    rng = np.random.RandomState(0)
    wnids = list(imagenet_wnid_names())
    blobs = _ilsvrc_archives(tmp_path / "made", wnids, rng)
    archives = tmp_path / "ilsvrc"
    archives.mkdir()
    for name, blob in blobs.items():
        (archives / name).write_bytes(blob)
    archives.chmod(0o555)  # the user's archives stay untouched: torchvision's meta.bin goes to staging
    meta = {part: (name, _md5(blobs[name])) for part, (name, _) in tv_imagenet.ARCHIVE_META.items()}
    monkeypatch.setattr(tv_imagenet, "ARCHIVE_META", meta)
    root = tmp_path / "data"
    code, err = run(capsys, "imagenet", "--data-root", str(root), "--archives", str(archives), "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in archives.iterdir()) == sorted(blobs)
    data = load_dataset("imagenet1k", root)
    assert data.n_classes == 1000 and len(data.train) == 1000 and len(data.test) == 1000
    # val image n belongs to the wnid the ground truth names for it
    ground_truth = [int(line) for line in (tmp_path / "made" / "ILSVRC2012_devkit_t12" / "data" /
                    "ILSVRC2012_validation_ground_truth.txt").read_text().split()]  # fmt: skip
    for n in (0, 1, 500, 999):
        image = root / "imagenet" / "val" / wnids[ground_truth[n] - 1] / f"ILSVRC2012_val_{n + 1:08d}.JPEG"
        assert image.is_file()
    # a damaged archive: one line, nothing extracted
    meta["val"] = (meta["val"][0], "0" * 32)
    code, err = run(capsys, "imagenet", "--force", "--data-root", str(tmp_path / "other"), "--archives",
                    str(archives), "--quiet")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "damaged" in err
    assert not (tmp_path / "other" / "imagenet").exists() and not list(
        (tmp_path / "other").glob(".prepare-*")
    )


@pytest.mark.parametrize(
    "dataset, target",
    [("cifar100", "cifar100"), ("imagenet_r", "imagenet_r"), ("imagenet100", "imagenet"), ("pets", "pets")],
)
def test_a_runs_missing_data_error_names_the_prepare_command(dataset, target, tmp_path):
    with pytest.raises(prepare.UserError) as error:
        load_zero_shot_target(dataset, tmp_path) if dataset == "pets" else load_dataset(dataset, tmp_path)
    assert f"python -m benchmarks.prepare {target} --data-root {tmp_path}" in str(error.value)


def test_a_runs_missing_weights_error_names_the_prepare_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(prepare.UserError, match="python -m benchmarks.prepare weights"):
        check_weights(BackboneSpec("ViT-B-16-quickgelu", "openai", cache_dir=str(tmp_path)))


def test_force_never_replaces_an_authors_split_the_official_files_lack(tmp_path):
    """A folder that holds the LAMDA family's train/ and test/ beside damaged official files (imagenet-a/,
    SUN397/, cub200/ hold both layouts) keeps them: --force refuses in one line and moves nothing."""
    final, built = tmp_path / "data" / "imagenet-a", tmp_path / "staging" / "imagenet-a"
    for folder in (final / "train" / "n01498041", final / "test" / "n01498041", built / "n01498041"):
        folder.mkdir(parents=True)
    (final / "train" / "n01498041" / "0.jpg").write_bytes(b"theirs")
    with pytest.raises(UserError, match=r"holds train/, test/ folders .* --force will not replace them"):
        prepare.install(built, final, force=True)
    assert (final / "train" / "n01498041" / "0.jpg").read_bytes() == b"theirs" and built.is_dir()
    # ImageNet's own files are train/ and val/: a built folder that holds them replaces its old ones
    (built / "train").mkdir(), (built / "test").mkdir()
    prepare.install(built, final, force=True)
    assert not (final / "train" / "n01498041").exists() and (final / "n01498041").is_dir()
