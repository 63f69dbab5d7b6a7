"""torchscope.doctor: diagnoses the pitfalls P1-P18 (docs/pitfalls.md) from recorded events.

Standard library and `torchscope.schema` only, so it runs offline on a .tscope file, inside
the server on stored events, and never in the training process's hot path.
"""

from torchscope.schema import Finding

from .engine import diagnose
from .settings import SETTING_HELP, Settings

__all__ = ["SETTING_HELP", "Finding", "Settings", "diagnose"]
