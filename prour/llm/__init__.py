"""Model backends behind one protocol (:mod:`prour.llm.base`), chosen by name
(:func:`prour.llm.registry.build_llm`; the registry reads :mod:`prour.config` and is not
imported here, so that the modules backends use can import :mod:`prour.llm.base` freely).
"""

from prour.llm.base import *  # the protocol's types, listed once in prour.llm.base.__all__
from prour.llm.base import __all__ as __all__
