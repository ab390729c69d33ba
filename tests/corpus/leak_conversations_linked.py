"""Conversations in a dict, each a linked list of turns (turn.previous), never closed.

expect: leak
holder: module __main__: CONVERSATIONS
"""

from _serve import cache_of, generate


class Message:
    def __init__(self, previous, cache):
        self.previous = previous
        self.cache = cache


CONVERSATIONS = {}
for i in range(15):
    conv = f"conv-{i % 4}"
    CONVERSATIONS[conv] = Message(CONVERSATIONS.get(conv), cache_of(generate(i)))
print("conversations", len(CONVERSATIONS))
