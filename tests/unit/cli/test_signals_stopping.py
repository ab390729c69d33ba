"""`cli.signals.stopping`: the stop callback never runs inside the signal handler."""

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import signal, threading
    from kvguardian.apps.cli.signals import stopping

    done = threading.Event()
    with stopping(done.set) as ending:
        with done._cond:  # the main thread inside Event.wait's lock, as a wait loop is between two waits
            signal.raise_signal(signal.SIGINT)  # the handler runs here, in this thread
        assert done.wait(10), "stop never ran"
    print("stopped by", ending.signum)
""")


def test_a_signal_while_the_main_thread_holds_the_stop_lock_does_not_deadlock():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "stopped by 2" in proc.stdout, proc.stderr
