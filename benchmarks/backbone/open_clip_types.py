"""Names for open_clip's model types in annotations. open_clip ships no type information, so a type
checker reads these as Any: reads such as ``model.visual.transformer.resblocks`` are whatever
open_clip builds, where ``nn.Module``'s own annotation would make each one ``Tensor | Module``."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from open_clip import CLIP as OpenCLIP
    from open_clip.transformer import ResidualAttentionBlock as OpenCLIPBlock
    from open_clip.transformer import Transformer as OpenCLIPTransformer
else:  # nothing to import at run time: annotations only
    OpenCLIP = OpenCLIPBlock = OpenCLIPTransformer = Any

__all__ = ["OpenCLIP", "OpenCLIPBlock", "OpenCLIPTransformer"]
