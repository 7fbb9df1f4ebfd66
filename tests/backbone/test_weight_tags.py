"""Weights by open_clip tag, checked offline against open_clip's own registry
(``benchmarks.backbone.tags``): unknown tags, the activation a tag was trained with, the checksum
its URL carries, where a file downloaded by hand goes, and what a result records of the file."""

import hashlib

import open_clip
import pytest

from benchmarks.backbone import BackboneSpec, check_names, check_weights, weights_file, weights_target_name
from benchmarks.backbone.tags import check_tag, download_url, manual_file, url_checksum
from benchmarks.core.errors import UserError, WeightsNotFoundError


@pytest.mark.parametrize(
    "model, tag",
    [
        ("ViT-B-16-quickgelu", "openai"),
        ("ViT-B-16", "laion400m_e32"),
        ("ViT-B-16", "laion2b_s34b_b88k"),
        ("ViT-B-16", "datacomp_xl_s13b_b90k"),
        ("ViT-B-32-quickgelu", "openai"),
        ("ViT-B-32-quickgelu", "laion400m_e32"),
        ("ViT-B-32", "laion2b_s34b_b79k"),
        ("ViT-L-14-quickgelu", "openai"),
        ("ViT-L-14", "laion400m_e32"),
        ("ViT-L-14", "laion2b_s32b_b82k"),
    ],
)
def test_the_weights_the_issue_names_pass_the_registry_check(model, tag):
    assert check_tag(model, tag) == open_clip.get_pretrained_cfg(model, tag)
    check_names(model, tag)


@pytest.mark.parametrize(
    "model, tag, use",
    [
        ("ViT-B-16", "openai", "ViT-B-16-quickgelu"),  # OpenAI's weights: QuickGELU
        ("ViT-B-32", "laion400m_e31", "ViT-B-32-quickgelu"),  # a LAION tag trained with QuickGELU
        ("ViT-L-14", "openai", "ViT-L-14-quickgelu"),
    ],
)
def test_weights_trained_with_the_other_activation_are_refused_naming_the_model_to_use(model, tag, use):
    with pytest.raises(UserError) as info:
        check_names(model, tag)
    message = str(info.value)
    assert "\n" not in message and "QuickGELU" in message and f"use model = {use!r}" in message


def test_a_tag_listed_for_the_other_activation_names_that_model():
    with pytest.raises(
        WeightsNotFoundError, match="for ViT-B-16, not for ViT-B-16-quickgelu; use model = 'ViT-B-16'"
    ):
        check_names("ViT-B-16-quickgelu", "laion400m_e32")


def test_an_unknown_tag_is_one_line_with_the_closest_tags():
    with pytest.raises(WeightsNotFoundError) as info:
        check_names("ViT-B-16", "laion400m")
    message = str(info.value)
    assert "\n" not in message and "did you mean laion400m_e32, laion400m_e31" in message


@pytest.mark.parametrize("pretrained", [None, "none", "/some/where/weights.pt", "weights.safetensors"])
def test_files_and_random_init_are_not_tags(pretrained):
    check_names("ViT-L-14", pretrained)  # nothing to check in the registry: no error
    with pytest.raises(UserError, match="did you mean ViT-L-14"):
        check_names("ViT-L14", pretrained)


def test_url_checksums_are_openais_whole_sha256_and_open_clips_first_8_digits():
    openai = open_clip.get_pretrained_cfg("ViT-B-16-quickgelu", "openai")
    assert url_checksum(openai) == openai["url"].split("/")[-2] and len(url_checksum(openai)) == 64
    laion = open_clip.get_pretrained_cfg("ViT-B-16", "laion400m_e32")
    assert url_checksum(laion) == "55e67d44"  # vit_b_16-laion400m_e32-55e67d44.pt
    assert url_checksum(open_clip.get_pretrained_cfg("ViT-B-16", "laion2b_s34b_b88k")) is None  # hub only


def test_a_file_put_by_hand_is_found_where_the_message_says(tmp_path):
    for model, tag in [("ViT-B-16", "laion400m_e32"), ("ViT-L-14", "laion2b_s32b_b82k")]:
        spec = BackboneSpec(model, tag, cache_dir=str(tmp_path))
        with pytest.raises(WeightsNotFoundError) as info:
            check_weights(spec)
        cfg = open_clip.get_pretrained_cfg(model, tag)
        place = manual_file(cfg, str(tmp_path))
        assert str(place) in str(info.value)
        assert f"python -m benchmarks.prepare {weights_target_name(model, tag)}," in str(info.value)
        assert download_url(cfg).startswith("https://") and download_url(cfg).endswith(place.name)
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(b"weights")
        assert check_weights(spec) == place
    assert weights_target_name("ViT-B-16-quickgelu", "openai") == "weights"


def test_a_result_records_the_loaded_files_name_and_sha256(tmp_path):
    path = tmp_path / "mine.safetensors"
    path.write_bytes(b"some weights")
    recorded = weights_file(BackboneSpec("ViT-B-16", str(path)))
    assert recorded == {"file": "mine.safetensors", "sha256": hashlib.sha256(b"some weights").hexdigest()}
    assert weights_file(BackboneSpec("ViT-B-16", None)) is None
    assert weights_file(BackboneSpec("ViT-B-16", "laion400m_e32", cache_dir=str(tmp_path))) is None  # absent
