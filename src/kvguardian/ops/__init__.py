"""Operations: the pre-OOM guard (`oom`) and Kubernetes (`k8s`: the KV-budget device plugin, manifests). Built on
`core` and on `runtime` (the guard's ledger and pools are what the pre-OOM guard measures and evicts)."""
