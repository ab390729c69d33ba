"""Sinks that render a command's output: one `reporter.Reporter` interface, a console and a JSON reporter,
and `escape` (what makes data from outside safe to print). They never mutate the ledger."""
