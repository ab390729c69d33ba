"""Sources: what observes KV memory and reports it into the ledger, and the narrow interface they use.

=============  ==============================================================================================
module         what it owns
=============  ==============================================================================================
`host`         the Protocols: `SourceHost` (what a source may use), `Source` (what a host asks of a source),
               `Auditable` (what the cross-rank check needs of a guard)
`scope`        `RequestScope`, the host a guard builds: the current request, implicit requests, fail-open
`grad`         evidence of grad-tracked KV (KVG101)
`retained`     declared retention (``guard.retain``)
`evictable`    retained caches the pre-OOM guard may evict (``guard.retain(..., evict=...)``)
`custom`       custom torch models with preallocated KV buffers (``guard.track_module``)
=============  ==============================================================================================

The transformers instrumentation is a source too; it lives in `kvguardian.hf`. Sources import the ledger and
this package, never `kvguardian.guard`.
"""

from kvguardian.sources.host import Auditable, ImplicitRequest, Source, SourceHost

__all__ = ["Auditable", "ImplicitRequest", "Source", "SourceHost"]
