"""A chat server keeps every session's last output in a module-level dict and never expires sessions.

expect: leak
holder: module __main__: SESSIONS
"""

from _serve import generate

SESSIONS = {}

for i in range(12):
    SESSIONS[f"user-{i}"] = {"output": generate(i), "turns": 1}
print("sessions", len(SESSIONS))
