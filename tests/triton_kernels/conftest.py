"""Triton tests run in .venv-triton (scripts/test.sh); kernels run on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported; elsewhere (the main environment) these tests skip.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
