"""Model families mmagent renders for; one module each (see :mod:`mmagent.policy.families.base`)."""

from mmagent.policy.families.base import (Family, UnsupportedModel, families, family_for_name, family_of,
                                          get_family, seconds_text)
from mmagent.policy.families.qwen2_5_vl import QWEN2_5_VL
from mmagent.policy.families.qwen3_vl import QWEN3_VL

#: the family a policy renders for when nothing says otherwise
DEFAULT_FAMILY = QWEN2_5_VL

__all__ = ["DEFAULT_FAMILY", "Family", "QWEN2_5_VL", "QWEN3_VL", "UnsupportedModel", "families", "family_for_name", "family_of",
           "get_family", "seconds_text"]
