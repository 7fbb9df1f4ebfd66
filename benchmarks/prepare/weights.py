"""The weights targets of ``prepare``: ``weights`` (OpenAI's ViT-B/16, every suite's default) and
``weights:MODEL/TAG`` (any weights open_clip's registry lists, e.g. ``weights:ViT-B-16/laion400m_e32``),
each into the cache the backbone loader looks in (``benchmarks.backbone.weights``).

A tag is checked against open_clip's registry (read without importing open_clip:
``benchmarks.backbone.registry``) before anything else (``benchmarks.backbone.tags``:
a tag it does not list, or weights trained with the other activation, are one line). A file whose
URL carries its SHA-256 (OpenAI's whole, open_clip's release files its first 8 digits) is verified:
one that fails is corrupt, and refused. Without the network the command says so in one line at
once (the hub's host is tried first, for a few seconds), naming where a file downloaded by hand goes.
"""

from __future__ import annotations

import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.backbone import registry
from benchmarks.backbone.tags import download_url, manual_file, url_checksum
from benchmarks.backbone.weights import DEFAULT_MODEL, BackboneSpec, check_names, check_weights
from benchmarks.core.errors import UserError
from benchmarks.prepare.fetch import Archive, NetworkError, checksum_matches, download, file_checksum

PREFIX = "weights"
DEFAULT_TAG = "openai"
#: how long the hub's host may take to accept a connection before the command says it is offline
REACH_TIMEOUT_S = 5.0


def parse_weights_target(name: str) -> tuple[str, str] | None:
    """(model, tag) of a weights target's name (``weights``: the default), checked against open_clip's
    registry; None for a name that is not a weights target."""
    if name == PREFIX:
        return DEFAULT_MODEL, DEFAULT_TAG
    if not name.startswith(PREFIX + ":"):
        return None
    model, _, tag = name[len(PREFIX) + 1 :].rpartition("/")
    if not model or not tag:
        raise UserError(f"{name!r}: name weights as weights:MODEL/TAG, e.g. weights:ViT-B-16/laion400m_e32")
    check_names(model, tag)
    return model, tag


@dataclass(frozen=True)
class Weights:
    """One model's weights by open_clip tag, as a ``prepare`` target."""

    model: str = DEFAULT_MODEL
    tag: str = DEFAULT_TAG

    @property
    def name(self) -> str:
        default = (self.model, self.tag) == (DEFAULT_MODEL, DEFAULT_TAG)
        return PREFIX if default else f"{PREFIX}:{self.model}/{self.tag}"

    @property
    def cfg(self) -> dict[str, Any]:
        return registry.get_pretrained_cfg(self.model, self.tag)

    @property
    def help(self) -> str:
        return f"{self.model} {self.tag} into open_clip's cache"

    def file(self) -> Path:
        """Where the loader looks for a file downloaded by hand (or from a mirror)."""
        return manual_file(self.cfg)

    def archive(self) -> Archive | None:
        """The file as a verified download (its URL and the SHA-256 it carries); None without both."""
        checksum = url_checksum(self.cfg)
        return Archive(self.cfg["url"], checksum, "sha256") if checksum else None

    def state(self, ctx=None) -> str:
        try:
            found = check_weights(BackboneSpec(self.model, self.tag))
        except UserError:
            return "missing"
        archive = self.archive()
        if archive is not None and found == self.file():
            if not checksum_matches(file_checksum(found, "sha256"), archive.checksum):
                return f"corrupt: {found} fails its SHA-256 check"
        return "present"

    def by_hand(self) -> str:
        where = f"download {download_url(self.cfg)} yourself and put it at {self.file()}"
        return f"{where}, or pass --weights FILE to runs"

    def prepare(self, ctx) -> None:
        if ctx.mirror:  # a plain folder: the file by name, where the loader looks for it
            archive = self.archive()
            if archive is None:
                raise UserError(
                    f"--mirror serves files by their checksummed URL's name, which {self.model}/{self.tag} "
                    f"has not; {self.by_hand()}"
                )
            self.file().unlink(missing_ok=True)  # a corrupt copy
            download(archive, self.file(), ctx.mirror, ctx.progress, ctx.limits)
            return
        self._check_reachable()
        from open_clip.pretrained import download_pretrained

        try:
            download_pretrained(self.cfg)  # the Hugging Face hub, as open_clip itself does
        except Exception as err:  # the hub client's errors have many types; all mean "not fetched"
            reason = " ".join(str(err).split())[:200] or type(err).__name__
            raise NetworkError(
                f"cannot download the {self.model} {self.tag} weights ({reason}); {self.by_hand()}"
            ) from None

    def _check_reachable(self) -> None:
        """One line at once where the hub cannot be reached, instead of its client's minute of retries."""
        from huggingface_hub import constants as hub

        if hub.HF_HUB_OFFLINE:
            raise NetworkError(
                f"HF_HUB_OFFLINE is set, so the {self.model} {self.tag} weights cannot be downloaded; "
                + self.by_hand()
            )
        endpoint = urllib.parse.urlsplit(hub.ENDPOINT)
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        try:
            socket.create_connection((endpoint.hostname, port), timeout=REACH_TIMEOUT_S).close()
        except OSError as err:
            raise NetworkError(
                f"downloading the {self.model} {self.tag} weights needs the network, and {endpoint.hostname} "
                f"cannot be reached ({err.strerror or type(err).__name__}); {self.by_hand()}"
            ) from None


def suite_weights() -> list[Weights]:
    """The default weights, then every other open_clip tag a suite names (its ``[backbone]`` or a
    variant's), for ``--list``; a suite that does not read is left out (running it says why)."""
    from benchmarks.runner.suites import available_suites, suite_backbones

    found = {Weights(): None}
    for name in available_suites():
        try:
            backbones = suite_backbones(name)
        except UserError:
            continue
        for backbone in backbones:
            if (weights := tag_weights(backbone["model"], backbone["pretrained"])) is not None:
                found[weights] = None
    return list(found)


def tag_weights(model: str, pretrained: str | None) -> Weights | None:
    """The ``prepare`` target of a model's weights where they are an open_clip tag; else None."""
    if pretrained is None or not registry.get_pretrained_cfg(model, pretrained):
        return None  # random, a file, the tiny model's synthetic weights
    return Weights(model, pretrained)
