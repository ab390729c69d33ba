"""A memo of answers to ten canned prompts (the first answer stays), asked in a rotation that covers them
all only after 15 of 24 requests; later requests are hits (their own output dropped). It grew for most of
the run and then stopped: bounded by its keys.

expect: clean
"""

from _serve import generate

ORDER = [0, 1, 0, 2, 1, 3, 0, 4, 5, 2, 6, 7, 1, 8, 9] + [i % 10 for i in range(9)]
MEMO = {}
for i, key in enumerate(ORDER):
    if key in MEMO:
        generate(100 + i)
    else:
        MEMO[key] = generate(key)
print("memo", len(MEMO))
