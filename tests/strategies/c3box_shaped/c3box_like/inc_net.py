"""C3Box's network habits: a factory that builds the whole CLIP, called twice by one network; a
network that calls open_clip itself; one that then reads its weights from ./c.pth."""

import open_clip
import torch
from torch import nn


def get_convnet(args, pretrained=False):
    name = args["backbone_type"].lower()
    if name == "clip":  # a download, were it not the run's model
        model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-16", pretrained="laion400m_e32")
        tokenizer = open_clip.get_tokenizer("ViT-B-16")
        model.out_dim = 512
        return model, preprocess, tokenizer
    raise NotImplementedError(f"Unknown type {name}")


class BaseNet(nn.Module):
    def __init__(self, args, pretrained):
        super().__init__()
        self.convnet = get_convnet(args, pretrained)  # the tuple, replaced below (as C3Box does)


class ClipNet(BaseNet):
    """Both towers of a whole CLIP, and a projection over its image features that trains."""

    def __init__(self, args, pretrained):
        super().__init__(args, pretrained)
        self.convnet, self.preprocess, self.tokenizer = get_convnet(args, pretrained)
        self.proj = nn.Linear(self.convnet.out_dim, self.convnet.out_dim).cuda()
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(self.convnet.out_dim))
            self.proj.bias.zero_()

    @property
    def feature_dim(self):
        return self.convnet.out_dim

    def encode_image(self, x):
        return self.proj(self.convnet.encode_image(x))

    def encode_text(self, x):
        return self.convnet.encode_text(x)


class DirectNet(nn.Module):
    """A network that calls open_clip itself, as C3Box's prompt-based networks do."""

    def __init__(self):
        super().__init__()
        self.clip, _, _ = open_clip.create_model_and_transforms("ViT-B-16", pretrained="laion400m_e32")


class PtmNet(nn.Module):
    """C3Box's PTM networks (APER's, EASE's, the prompt methods'): the CLIP built, its weights read
    from ./c.pth, its depth counted from open_clip's state-dict keys."""

    def __init__(self):
        super().__init__()
        self.clip, _, _ = open_clip.create_model_and_transforms("ViT-B-16", pretrained="laion400m_e32")
        self.clip.load_state_dict(torch.load("./c.pth", map_location="cpu", weights_only=True))
        state = self.clip.state_dict()
        self.vision_layers = len(
            [k for k in state if k.startswith("visual.") and k.endswith(".attn.in_proj_weight")]
        )
