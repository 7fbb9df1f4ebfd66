"""A model module that downloads at import itself."""

import urllib.request

from models.utils.continual_model import ContinualModel

CONFIG = urllib.request.urlopen("https://config.example.org/fetches.json", timeout=30).read()


class Fetches(ContinualModel):
    NAME = "fetches"
    COMPATIBILITY = ["class-il"]
