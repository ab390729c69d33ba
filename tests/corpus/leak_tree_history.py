"""A conversation tree: every regenerated answer is a child node of the message it answers; the tree's
root is a global and no branch is ever pruned.

expect: leak
holder: module __main__: TREE
"""

from _serve import generate


class Node:
    def __init__(self, output=None):
        self.output = output
        self.children = []


TREE = Node()
frontier = [TREE]
for i in range(14):
    parent = frontier[i // 2]
    child = Node(generate(i))
    parent.children.append(child)
    frontier.append(child)
del frontier, parent, child
print("nodes", 15)
