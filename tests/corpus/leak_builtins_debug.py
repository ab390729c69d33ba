"""A debugging aid left in: every output goes onto a list stored in builtins so any module can read it.

expect: leak
holder: builtins
"""

import builtins

from _serve import generate

builtins.KV_DEBUG = []
for i in range(12):
    builtins.KV_DEBUG.append(generate(i))
print("kept", len(builtins.KV_DEBUG))
