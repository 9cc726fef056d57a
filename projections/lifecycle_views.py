"""The core lifecycle views, one module each in ``projections.views`` (this module keeps
the import path the command side uses; import from ``projections.views.<view>``)."""

from __future__ import annotations

from projections.views.installed_pack import INSTALLED_PACK, InstalledPackView
from projections.views.pack_activation import PACK_ACTIVATION, PackActivationView
from projections.views.pack_component import PACK_COMPONENT, PackComponentView
from projections.views.pack_generation import PACK_GENERATION, PackGenerationView

__all__ = [
    "INSTALLED_PACK",
    "PACK_ACTIVATION",
    "PACK_COMPONENT",
    "PACK_GENERATION",
    "InstalledPackView",
    "PackActivationView",
    "PackComponentView",
    "PackGenerationView",
]
