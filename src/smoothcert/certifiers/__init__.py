"""Certifiers, one module per algorithm; importing this package registers them all.

Every module of this package is imported here, so a new certifier only needs its own file with a
``@register_certifier`` class (see ``certifier.py``).
"""

from ..registry import import_submodules
from .certifier import (
    CERTIFIERS,
    CERTIFY_COLUMNS,
    Certifier,
    RunContext,
    build_certifier,
    certificate_row,
    certifying,
    register_certifier,
)

import_submodules(__name__, __path__, skip=("certifier",))

__all__ = [
    "CERTIFIERS",
    "CERTIFY_COLUMNS",
    "Certifier",
    "RunContext",
    "build_certifier",
    "certificate_row",
    "certifying",
    "register_certifier",
]
