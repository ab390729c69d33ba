"""Sources: what observes KV memory and reports it into the ledger, and the narrow interface they use.

`host` (the `SourceHost`, `Source` and `Auditable` Protocols), `scope` (`RequestScope`, the host a guard
builds), `grad` (KVG101 evidence), `retained` and `evictable` (declared retention), `custom` (custom torch
models). The transformers source lives in `kvguardian.runtime.hf`. Sources import the ledger and this package, never
`kvguardian.runtime.guard`. Details: docs/design/sources.md.
"""

from kvguardian.runtime.sources.host import Auditable, ImplicitRequest, Source, SourceHost

__all__ = ["Auditable", "ImplicitRequest", "Source", "SourceHost"]
