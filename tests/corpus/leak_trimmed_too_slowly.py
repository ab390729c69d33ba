"""Twin of clean_trimmed_in_bursts: the buffer is "trimmed" once it passes six entries, but only its oldest
entry, every third request - it evicts, and still grows by two entries every three requests.

expect: leak
holder: module __main__: RECENT
"""

from _serve import generate

RECENT = []
for i in range(24):
    RECENT.append(generate(i))
    if len(RECENT) > 6 and i % 3 == 0:
        del RECENT[0]
print("recent", len(RECENT))
