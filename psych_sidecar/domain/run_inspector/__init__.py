"""The Run inspector's reads: Runs, a Run's model calls with their usage and cache misses,
its compactions, its tool results, a reader over one of them, and a tenant's connections.

Owns :class:`RunInspector` (read-only, over the other concerns' services and ports: Runs are
the RunService's one listing, records the LogReader's summaries) and the cache-miss
explainer (:func:`explain_miss`).
:class:`StoredCatalog` and :class:`PinnedStates` let a reader with no MCP sessions (``inspect
--database-url``) run the other concerns' services over the database as stored.
"""

from __future__ import annotations

from psych_sidecar.domain.run_inspector.explain import (
    CacheMiss,
    MissCause,
    MissReason,
    explain_miss,
)
from psych_sidecar.domain.run_inspector.service import (
    CatalogVersionView,
    CompactionView,
    ConnectionView,
    ModelCall,
    ResultRow,
    RunInspector,
    Timeline,
    compaction_views,
    pair_usage,
)
from psych_sidecar.domain.run_inspector.stored import PinnedStates, StoredCatalog

__all__ = [
    "CacheMiss",
    "CatalogVersionView",
    "CompactionView",
    "ConnectionView",
    "MissCause",
    "MissReason",
    "ModelCall",
    "PinnedStates",
    "ResultRow",
    "RunInspector",
    "StoredCatalog",
    "Timeline",
    "compaction_views",
    "explain_miss",
    "pair_usage",
]
