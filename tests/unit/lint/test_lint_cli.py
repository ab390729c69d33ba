"""The command: formats, exit codes, configuration, and bad input that must never become a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvguardian.apps.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"
SCHEMA = Path(__file__).resolve().parents[2] / "fixtures" / "sarif-schema-2.1.0.json"

LEAKY = '''import time
import redis
r = redis.Redis()
def f(v):
    r.set(f"k:{time.time()}", v)
'''


def _run(capsys, *argv):
    code = main(["lint", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_format_like_ruff_and_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text(LEAKY)
    (tmp_path / "ok.py").write_text("x = 1\n")
    code, out, _ = _run(capsys, "app.py", "ok.py")
    assert code == 1
    assert out.splitlines()[0].startswith("app.py:5:5: KVG405 Redis SET of key f'k:{time.time()}'")
    assert out.splitlines()[-1] == "Found 1 finding in 2 files."
    assert _run(capsys, "ok.py")[0] == 0
    assert _run(capsys, "app.py", "--exit-zero")[0] == 0
    assert _run(capsys, "app.py", "--ignore", "KVG405")[0] == 0


def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "--select", "KVG999", ".")
    assert code == 2 and "unknown rule selector 'KVG999'" in err and len(err.splitlines()) == 1
    code, _, err = _run(capsys, "does-not-exist")
    assert code == 2 and "no such file or directory: does-not-exist" in err
    (tmp_path / "pyproject.toml").write_text('[tool.kv-guardian.lint]\nselct = ["KVG401"]\n')
    code, _, err = _run(capsys, ".")
    assert code == 2 and "unknown key(s) selct" in err
    with pytest.raises(SystemExit) as exc:
        main(["lint", "--format", "xml"])
    assert exc.value.code == 2


def test_pyproject_config_select_ignore_exclude_per_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(LEAKY)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "b.py").write_text(LEAKY)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "c.py").write_text(LEAKY)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kv-guardian.lint]\nselect = ["KVG4"]\nextend-exclude = ["gen"]\n'
        'per-file-ignores = { "scripts/*" = ["KVG405"] }\n')
    code, out, _ = _run(capsys, ".")
    assert code == 1 and "pkg/a.py:5:5: KVG405" in out and "gen/" not in out and "scripts/" not in out
    code, out, _ = _run(capsys, ".", "--select", "KVG401")
    assert code == 0


def test_json_format(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text(LEAKY)
    (tmp_path / "bad.py").write_text("def (:\n")
    code, out, _ = _run(capsys, "--format", "json", ".")
    data = json.loads(out)
    assert code == 1 and data["counts"] == {"KVG405": 1} and data["files"] == 1
    f = data["findings"][0]
    assert (f["id"], f["name"], f["path"], f["line"], f["col"], f["severity"]) == (
        "KVG405", "redis-key-no-ttl", "app.py", 5, 5, "warning")
    assert data["skipped"][0]["path"] == "bad.py" and "does not parse as Python" in data["skipped"][0]["reason"]


def test_sarif_validates_against_the_sarif_2_1_0_schema(tmp_path, capsys, monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text(LEAKY)
    (tmp_path / "bad.py").write_text("def (:\n")
    code, out, _ = _run(capsys, "--format", "sarif", ".")
    log = json.loads(out)
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(log)
    run = log["runs"][0]
    assert code == 1 and log["version"] == "2.1.0"
    rules = run["tool"]["driver"]["rules"]
    res = run["results"][0]
    assert rules[res["ruleIndex"]]["id"] == res["ruleId"] == "KVG405"
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "app.py", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == 5 and res["partialFingerprints"]["primaryLocationLineHash"]
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert "bad.py" in notes[0]["message"]["text"]
    # an invalid log is refused by the same validator: the check can fail
    broken = json.loads(out)
    broken["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(broken)


def test_github_annotations_escape_properties_and_data(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "a,b:c.py"
    (tmp_path / name).write_text(LEAKY)
    code, out, _ = _run(capsys, "--format", "github", name)
    line = out.splitlines()[0]
    assert code == 1
    assert line.startswith("::warning file=a%2Cb%3Ac.py,line=5,col=5,endLine=5,title=KVG405 redis-key-no-ttl::")


def test_bad_inputs_one_line_each_and_the_rest_continues(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "src"
    d.mkdir()
    (d / "good.py").write_text(LEAKY)
    (d / "syntax.py").write_text("def broken(:\n")
    (d / "binary.py").write_bytes(b"\x00\x01\x02ELF" * 10)
    (d / "latin.py").write_bytes(b"# comment\nx = '\xe9\xff'\n")
    (d / "cookie.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    (d / "deep.py").write_text("x = " + "(" * 500 + "1" + ")" * 500 + "\n")
    (d / "long.py").write_text("x = " + " + ".join(["1"] * 20000) + "\n")  # parses; too deep to walk
    (d / "loop").symlink_to(d)  # a symlink loop
    (d / "dangling.py").symlink_to(d / "missing.py")
    code, out, err = _run(capsys, "src")
    assert code == 1 and "src/good.py:5:5: KVG405" in out
    lines = err.splitlines()
    assert all(line.startswith("kv-guardian lint: ") for line in lines)
    assert "Traceback" not in out + err
    joined = "\n".join(lines)
    assert "src/syntax.py:1: does not parse as Python" in joined
    assert "src/binary.py: binary file" in joined
    assert "src/latin.py: not valid utf-8 (byte 0xe9 at offset 15)" in joined
    assert "cookie.py" not in joined  # a declared latin-1 file is read
    assert "src/loop: directory already visited (a symbolic-link loop" in joined
    assert "src/dangling.py: broken symbolic link" in joined
    assert "src/deep.py:1: does not parse as Python (too many nested parentheses" in joined
    assert "src/long.py" not in joined or "src/long.py: nested too deeply" in joined  # linted or one line


def test_control_characters_in_paths_are_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "evil\x1b[31m.py"
    (tmp_path / name).write_text(LEAKY)
    code, out, _ = _run(capsys, ".")
    assert code == 1 and "\x1b" not in out and "evil\\x1b[31m.py:5:5: KVG405" in out


@pytest.mark.slow
def test_a_directory_of_100k_files(tmp_path):
    """100,000 files (99,000 that are not sources): walked as a stream, linted, one summary line."""
    root = tmp_path / "many"
    for i in range(100):
        sub = root / f"d{i:03d}"
        sub.mkdir(parents=True)
        for j in range(1000):
            name = f"m{j}.py" if j < 10 else f"data{j}.txt"
            fd = os.open(sub / name, os.O_CREAT | os.O_WRONLY)
            if j == 0 and i == 0:
                os.write(fd, LEAKY.encode())
            os.close(fd)
    proc = subprocess.run([sys.executable, "-m", "kvguardian", "lint", "--format", "json", "many"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["files"] == 1000 and data["counts"] == {"KVG405": 1}
    assert proc.stderr == ""


def test_pre_commit_hook_definition():
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((Path(__file__).resolve().parents[3] / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "kv-guardian-lint")
    assert hook["entry"] == "kv-guardian lint" and hook["language"] == "python"
    assert set(hook["types_or"]) >= {"python", "go", "java", "kotlin"}


def test_fifos_and_devices_are_skipped_never_read(tmp_path):
    """A FIFO named *.py hung the walk; a link to /dev/zero read until MemoryError: only regular files are read,
    the rest get one line each (in a directory and named explicitly)."""
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    (tmp_path / "app.py").write_text(LEAKY)
    proc = subprocess.run([sys.executable, "-m", "kvguardian", "lint", ".", "pipe.py", "zero.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "app.py:5:5: KVG405" in proc.stdout, proc.stderr
    err = proc.stderr.splitlines()
    assert err.count("kv-guardian lint: pipe.py: not a regular file (a FIFO, device or socket); skipped") == 2
    assert err.count("kv-guardian lint: zero.py: not a regular file (a FIFO, device or socket); skipped") == 2
    assert len(err) == 4 and "Traceback" not in proc.stderr


def test_read_source_checks_the_opened_file_and_bounds_the_read(tmp_path, monkeypatch):
    from kvguardian.lint import files

    os.mkfifo(tmp_path / "late.py")  # a FIFO reaching read_source (swapped in after the walk): never blocks
    skipped = files.read_source(str(tmp_path / "late.py"))
    assert isinstance(skipped, files.Skipped) and "not a regular file" in skipped.reason
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 100)
    monkeypatch.setattr(files, "MAX_BYTES", 64)
    monkeypatch.setattr(os.path, "getsize", lambda p: 0)  # the size comes from the opened file's stat
    skipped = files.read_source(str(big))
    assert isinstance(skipped, files.Skipped) and "larger than" in skipped.reason and "(600 bytes)" in skipped.reason


def test_non_utf8_file_names_in_sarif_and_text(tmp_path, capsys, monkeypatch):
    """SARIF crashed with UnicodeEncodeError on a name with a non-UTF-8 byte; text printed the raw byte."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / os.fsdecode(b"bad\xffname.py")).write_text(LEAKY)
    (tmp_path / os.fsdecode(b"syn\xfe.py")).write_text("def (:\n")
    code, out, _ = _run(capsys, "--format", "sarif", ".")
    run = json.loads(out)["runs"][0]
    assert code == 1 and "\\udc" not in out
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad%FFname.py"
    note = run["invocations"][0]["toolExecutionNotifications"][0]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "syn%FE.py"
    assert note["message"]["text"].startswith("syn\\xfe.py: does not parse")
    code, out, err = _run(capsys, ".")
    assert code == 1 and out.startswith("bad\\xffname.py:5:5: KVG405") and "\udcff" not in out
    assert "syn\\xfe.py:1: does not parse" in err and "\udcfe" not in err


def test_bidi_and_format_characters_escaped_in_text_and_github(tmp_path, capsys, monkeypatch):
    """U+202E (right-to-left override) and friends in file names reached the terminal raw; so did the file name
    in the github format's ``file=`` property."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rtl\u202egnp.py").write_text(LEAKY)
    (tmp_path / "zw\u200bsp\x1b[31m.py").write_text(LEAKY)
    code, out, _ = _run(capsys, ".")
    assert code == 1 and "rtl\\u202egnp.py:5:5: KVG405" in out and "zw\\u200bsp\\x1b[31m.py:5:5" in out
    code, gh, _ = _run(capsys, "--format", "github", ".")
    assert "::warning file=rtl\\u202egnp.py,line=5" in gh and "::warning file=zw\\u200bsp\\x1b[31m.py,line=5" in gh
    for text in (out, gh):
        assert not any(ch in text for ch in "\u202e\u200b\x1b")


def test_bidi_characters_in_go_keys_escaped(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tree_sitter", reason="Go needs kv-guardian[lint]")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rtl.go").write_text('package c\n\nimport "time"\n\nfunc S(rdb *R, v string) {\n'
                                     '\trdb.Set(ctx, "s:\u202eevil"+time.Now().String(), v, 0)\n}\n')
    for fmt in ("text", "github"):
        code, out, _ = _run(capsys, "--format", fmt, ".")
        assert code == 1 and "\u202e" not in out and 'key "s:\\u202eevil"+time.Now()' in out, out


def test_an_unwritable_output_is_refused_before_linting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text(LEAKY)
    import kvguardian.apps.cli.lint as cli_lint

    def never(*args, **kwargs):
        raise AssertionError("linted before the output path was checked")

    monkeypatch.setattr(cli_lint, "lint_paths", never)
    for bad in ("/proc/x/y", str(tmp_path / "missing" / "out.sarif"), str(tmp_path)):
        code, _, err = _run(capsys, "-o", bad, ".")
        assert code == 2 and "--output" in err and "fix:" in err and len(err.splitlines()) == 1, err


def test_an_output_that_is_a_linted_source_is_refused(tmp_path, kv_cli):
    src = tmp_path / "app.py"
    src.write_text("x = 1\n")
    for argv in (["lint", str(src), "-o", str(src)], ["lint", str(tmp_path), "-o", str(src)]):
        rc, _, err = kv_cli(*argv)
        assert rc == 2 and "is also a file linted" in err and src.read_text() == "x = 1\n", (argv, err)
    rc, _, _ = kv_cli("lint", str(src), "-o", str(tmp_path / "report.txt"))
    assert rc == 0 and (tmp_path / "report.txt").exists()
