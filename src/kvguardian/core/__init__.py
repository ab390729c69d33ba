"""The core every wing builds on: errors, findings, the ledger, tensors and holder chains, detectors, reports
and metrics exporters. It knows no product: nothing here imports a wing (`runtime`, `ops`, `keyspace`, ...)."""
