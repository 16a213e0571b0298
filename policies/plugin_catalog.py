"""What the policy loader needs to know of the EPP's plugins, without importing the EPP.

``epp.scheduling.registry.CATALOG`` implements it; whoever loads a policy to run it (the
gateway, the EPP, ``kvgate policy check``) passes that catalog to ``load_policy``. Without one
the loader checks the ``epp:`` section's structure only, and the EPP checks types and parameters
when it builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

PluginKind = Literal["filter", "scorer", "picker"]


class PluginCatalog(Protocol):
    def kind_of(self, type_name: str) -> PluginKind | None:
        """The kind of a registered plugin type; ``None`` when no such type is registered."""
        ...

    def check(self, type_name: str, name: str, params: Mapping[str, object]) -> None:
        """Raise ``ValueError`` (naming the plugin and field) when ``params`` are invalid for
        ``type_name``; builds nothing."""
        ...
