"""Errors are wrapped (raise ... from exc) and the wrappers kept in an error log; the original exception's
traceback, reached through __cause__, holds the frame with the cache.

expect: leak
holder: module __main__: ERROR_LOG
"""

from _serve import cache_of, generate

ERROR_LOG = []


class RequestFailed(Exception):
    pass


def postprocess(i):
    cache = cache_of(generate(i))
    if len(cache.layers) > 0:
        raise ValueError(f"bad output {i}")


def handle(i):
    try:
        postprocess(i)
    except ValueError as exc:
        raise RequestFailed(i) from exc


for i in range(10):
    try:
        handle(i)
    except RequestFailed as err:
        ERROR_LOG.append(err)
print("errors", len(ERROR_LOG))
