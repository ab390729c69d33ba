"""A custom logging handler keeps every record for a crash report; each record's args carry the request's
output (logger.debug("done %s", out)), so the handler holds every output. (logging.shutdown at exit
flushes and closes it, which does not drop its records.)

expect: leak
holder: module __main__: CRASH_REPORT
holder: CrashReportHandler.records
"""

import logging

from _serve import generate, only_to


class CrashReportHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


CRASH_REPORT = CrashReportHandler()
log = only_to("server", CRASH_REPORT, logging.DEBUG)

for i in range(12):
    out = generate(i)
    log.debug("request %d done: %s", i, out)
del out
print("kept", len(CRASH_REPORT.records))
