"""Loaded by every Python process started under `kv-guardian run` (this folder is put first on PYTHONPATH).

It only activates kv-guardian's import hook when KVG_RUN_DIR is set, then runs the sitecustomize that it
shadows, if any. It never stops the program: any failure is one line on stderr.
"""

import os
import sys


def _kvg_activate() -> None:
    if not os.environ.get("KVG_RUN_DIR"):
        return
    try:
        from kvguardian.runtime.autorun import child

        child.activate()
    except Exception as exc:  # fail open: the program runs unaudited
        sys.stderr.write(f"kv-guardian run: could not instrument this process ({type(exc).__name__}: {exc}); "
                         "it runs unaudited\n")


def _kvg_chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.getcwd()) == here:
                continue
            cand = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        except Exception:
            continue
        if os.path.isfile(cand):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_kvg_shadowed_sitecustomize", cand)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(module)
                except Exception as exc:  # what site.execsitecustomize prints, so stderr is as without us
                    if sys.flags.verbose:
                        sys.excepthook(*sys.exc_info())
                    else:
                        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                                         f"{exc.__class__.__name__}: {exc}\n")
            return


_kvg_activate()
_kvg_chain()
