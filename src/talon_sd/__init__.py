"""talon-sd: lossless tree speculative decoding with TALON adaptive draft trees (arXiv 2601.07353).

Public API: :class:`SpeculativeGenerator` (generate / stream), the configs, :class:`DraftTree`,
the builder and drafter registries. See README.md.
"""

from .builders import BUILDERS, TreeBuilder, make_builder
from .config import GenerationConfig, SamplingConfig, TreeConfig
from .drafters import DRAFTERS, Drafter, ModelDrafter, NgramDrafter
from .errors import TalonError
from .generator import GenerationResult, SpeculativeGenerator, TextStream
from .stats import DecodeStats
from .tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "BUILDERS", "DRAFTERS", "DecodeStats", "DraftTree", "Drafter", "GenerationConfig", "GenerationResult",
    "ModelDrafter", "NgramDrafter", "SamplingConfig", "SpeculativeGenerator", "TalonError", "TextStream",
    "TreeBuilder", "TreeConfig", "make_builder", "__version__",
]
