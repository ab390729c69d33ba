"""The latest output per tenant, for three fixed tenants: each entry is replaced, so the table is bounded
by its keys.

expect: clean
"""

from _serve import generate

LATEST = {}
for i in range(18):
    LATEST[("acme", "globex", "initech")[i % 3]] = generate(i)
print("tenants", len(LATEST))
