"""Records with __slots__ (no instance dict at all) keep each request's cache in an audit list.

expect: leak
holder: module __main__: AUDIT
"""

from _serve import cache_of, generate


class AuditRecord:
    __slots__ = ("cache", "request_id")

    def __init__(self, request_id, cache):
        self.request_id = request_id
        self.cache = cache


AUDIT = []
for i in range(12):
    AUDIT.append(AuditRecord(f"r{i}", cache_of(generate(i))))
print("audited", len(AUDIT))
