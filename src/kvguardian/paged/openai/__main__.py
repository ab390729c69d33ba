"""``python -m kvguardian.paged.openai [options]`` is ``kv-guardian serve-mini [options]``."""

import sys

from kvguardian.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["serve-mini", *sys.argv[1:]]))
