"""A request profiler installed with ``sys.setprofile``: the profile function keeps every request's output
in a list set as its attribute; nothing but the interpreter's thread state holds the function.

expect: leak
holder: sys.getprofile() (this thread's profile function)
"""

import sys

from _serve import generate


def install():
    def profile(frame, event, arg):
        return None

    profile.records = []
    return profile


def serve(profile, n):
    for i in range(n):
        profile.records.append(generate(i))


prof = install()
serve(prof, 12)
sys.setprofile(prof)  # from here on only the thread state holds it
del prof
print("profiling")
