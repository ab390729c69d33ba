"""CLI conventions: --help everywhere, one-line errors with the right exit code, never a traceback."""

import pytest

from kvguardian.apps.cli import COMMANDS, build_parser, main


def subcommand_paths():
    parser = build_parser()
    paths = []

    def walk(p, prefix):
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    paths.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(parser, [])
    return paths


def test_every_registered_command_is_in_the_parser():
    top = {p[0] for p in subcommand_paths()}
    assert set(COMMANDS) <= top


@pytest.mark.parametrize("path", [[], *subcommand_paths()], ids=lambda p: " ".join(p) or "kv-guardian")
def test_help_everywhere(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["nosuchcommand"], "invalid choice"),
        (["repro", "grad-tracking", "--steps", "abc"], "--steps 'abc' is not a list of integers; fix:"),
        (["repro", "grad-tracking", "--steps", "64"], "needs at least two step counts"),
        (["repro", "orphaned", "--requests", "3"], "--requests 3 is out of range; fix:"),
        (["repro", "orphaned", "--requests", "x"], "invalid int value"),
        (["demo", "--only", "nope"], "invalid choice"),
    ],
)
def test_user_mistakes_are_one_line_with_exit_2(argv, fragment, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit through SystemExit
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().out


def test_internal_error_is_one_line(monkeypatch, capsys):
    import kvguardian.apps.repro.grad_tracking as gt

    def boom(steps, spec=None):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(gt, "measure", boom)
    assert main(["repro", "grad-tracking", "--steps", "2,4"]) == 70
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "internal error: RuntimeError: kaboom" in err
