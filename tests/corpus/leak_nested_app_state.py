"""A web app's state dict nests a per-user cache table three levels deep; nothing evicts users.

expect: leak
holder: module __main__: APP
"""

from _serve import cache_of, generate

APP = {"state": {"caches": {"by_user": {}}, "config": {"max_tokens": 3}}}
for i in range(14):
    APP["state"]["caches"]["by_user"][f"u{i}"] = cache_of(generate(i))
print("users", len(APP["state"]["caches"]["by_user"]))
