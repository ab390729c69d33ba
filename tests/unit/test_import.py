import subprocess
import sys


def test_import_does_not_load_torch_or_transformers():
    code = (
        "import sys, kvguardian, kvguardian.core.findings, kvguardian.core.ledger, kvguardian.runtime.guard;"
        "import kvguardian.apps.cli;"
        "kvguardian.apps.cli.build_parser();"
        "bad = [m for m in ('torch', 'transformers', 'redis', 'prometheus_client', 'zmq') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_api():
    import kvguardian

    assert {"Guard", "Finding", "Report", "Severity", "Ledger"} <= set(kvguardian.__all__)
    assert kvguardian.Guard.__name__ == "Guard"
