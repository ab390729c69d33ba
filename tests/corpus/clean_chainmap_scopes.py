"""Per-request scopes pushed on a ChainMap while a request runs and popped when it ends; only the base
mapping (configuration, no KV) stays.

expect: clean
"""

from collections import ChainMap

from _serve import generate

SCOPES = ChainMap({"temperature": 0.0})
for i in range(16):
    SCOPES = SCOPES.new_child({"output": generate(i)})
    n = len(SCOPES["output"].sequences)
    SCOPES = SCOPES.parents
print("scopes", len(SCOPES.maps), n)
