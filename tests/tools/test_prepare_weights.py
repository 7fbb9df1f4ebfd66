"""``python -m benchmarks.prepare weights:MODEL/TAG``: any weights open_clip's registry lists, by tag,
checked offline in one line; without the network one line at once; checksums the URL carries."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest
from huggingface_hub import constants as hub

from benchmarks.backbone import DEFAULT_MODEL, BackboneSpec, check_weights
from benchmarks.prepare import command as prepare
from benchmarks.prepare import weights as prepare_weights
from benchmarks.prepare.fetch import checksum_matches

LAION = "weights:ViT-B-16/laion400m_e32"
LAION_FILE = "vit_b_16-laion400m_e32-55e67d44.pt"  # open_clip's URL: the file's SHA-256 begins 55e67d44


def run(capsys, *argv) -> tuple[int, str]:
    code = prepare.main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home of its own (open_clip's cache, ~/.cache/clip, under it) and a hub that is not there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    return tmp_path / "home"


@pytest.mark.parametrize("target", ["weights", LAION, "weights:ViT-L-14/laion2b_s32b_b82k"])
def test_offline_prepare_is_one_line_at_once_naming_where_a_file_goes(target, home, capsys, monkeypatch):
    hosts = []
    connect = socket.create_connection
    monkeypatch.setattr(
        socket,
        "create_connection",
        lambda address, *a, **k: hosts.append(address) or connect(address, *a, **k),
    )
    start = time.perf_counter()
    code, err = run(capsys, target, "--data-root", str(home / "data"), "--quiet")
    assert time.perf_counter() - start < 10
    assert code == 2 and err.count("\n") == 1 and "needs the network" in err
    assert hosts == [("127.0.0.1", 9)]  # the hub's host, tried once: no retries
    model, tag = prepare_weights.parse_weights_target(target)
    where = prepare_weights.Weights(model, tag).file()
    assert f"put it at {where}," in err and str(home / ".cache" / "clip") in str(where)


@pytest.mark.parametrize(
    "target, words",
    [
        ("weights:ViT-B-16/laion400m", "did you mean laion400m_e32"),
        ("weights:ViT-B-16/openai", "use model = 'ViT-B-16-quickgelu'"),
        ("weights:ViT-B-16-quickgelu/laion400m_e32", "use model = 'ViT-B-16'"),
        ("weights:ViT-B16/openai", "did you mean ViT-B-16"),
        ("weights:laion400m_e32", "weights:MODEL/TAG"),
    ],
)
def test_a_tag_the_registry_does_not_list_is_one_line(target, words, home, capsys):
    code, err = run(capsys, target, "--quiet")
    assert code == 2 and err.count("\n") == 1 and words in err


@pytest.mark.slow  # --list loads every suite (the strategies' imports)
def test_a_file_put_by_hand_is_checked_against_the_checksum_its_url_carries(home, capsys):
    place = home / ".cache" / "clip" / LAION_FILE
    place.parent.mkdir(parents=True)
    place.write_bytes(b"not the LAION weights")  # its SHA-256 does not begin 55e67d44
    code, err = run(capsys, LAION, "--quiet")
    assert code == 2 and "fails its SHA-256 check" in err and "--force" in err
    code, out = prepare.main(["--list"]), capsys.readouterr().out
    assert code == 0 and f"| {LAION} | corrupt: {place} fails its SHA-256 check |" in out


def test_a_mirror_serves_a_tag_whose_url_carries_the_first_digits_of_its_checksum(
    home, tmp_path, capsys, monkeypatch
):
    blob = b"LAION weights, say"
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / LAION_FILE).write_bytes(blob)
    url = prepare_weights.Weights("ViT-B-16", "laion400m_e32").cfg["url"]
    digits = hashlib.sha256(blob).hexdigest()[:8]
    monkeypatch.setattr(
        prepare_weights.Weights, "archive", lambda self: prepare.Archive(url, digits, "sha256")
    )
    assert "| weights:ViT-B-16/laion400m_e32 | missing |" in prepare._list(
        prepare.Context(tmp_path, tmp_path)
    )
    code, err = run(capsys, LAION, "--mirror", str(mirror), "--quiet")
    assert code == 0, err
    assert check_weights(BackboneSpec("ViT-B-16", "laion400m_e32")) == home / ".cache" / "clip" / LAION_FILE
    code, err = run(capsys, LAION, "--mirror", str(mirror), "--quiet")
    assert code == 0 and "already prepared" in err


def test_a_hub_only_tag_from_a_mirror_is_one_line_naming_where_its_file_goes(home, tmp_path, capsys):
    code, err = run(capsys, "weights:ViT-B-16/laion2b_s34b_b88k", "--mirror", str(tmp_path), "--quiet")
    assert code == 2 and err.count("\n") == 1
    assert str(home / ".cache/clip/laion/CLIP-ViT-B-16-laion2B-s34B-b88K/open_clip_model.safetensors") in err


def test_the_default_weights_by_tag_are_the_weights_target():
    args = prepare.parse_args([f"weights:{DEFAULT_MODEL}/openai", "weights"])
    assert args.targets == ["weights"]


@pytest.mark.slow  # --list loads every suite (the strategies' imports)
def test_list_shows_the_weights_each_suite_names(home, tmp_path, capsys):
    assert prepare.main(["--list", "--data-root", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| weights")]
    assert [row.split(" | ")[0] for row in rows] == ["| weights", f"| {LAION}"]  # backbones.toml's LAION rows
    assert all(" | missing | " in row for row in rows)


def test_checksums_match_whole_or_by_their_first_digits_only():
    digest = hashlib.sha256(b"x").hexdigest()
    assert checksum_matches(digest, digest) and checksum_matches(digest, digest[:8].upper())
    assert not checksum_matches(digest, digest[:7]) and not checksum_matches(digest, "")
    assert not checksum_matches(digest, "0" * 8)
