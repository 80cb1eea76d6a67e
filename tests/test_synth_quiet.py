"""`synth --quiet` is quiet: nothing on stdout or stderr when all is well (the README's `synth ... &` recipe
runs it in the shell's background, where a line on stderr lands over the prompt); an engine log still
records that it joined (up, launch and the demo start it with --quiet and its output in a log file)."""

from __future__ import annotations

import subprocess

from testkit.cli import cli_argv, run_cli


def test_quiet_synth_says_nothing_on_a_pipe(gpu_key, runtime_dir):
    r = run_cli("synth", "--weight", "1", "--gpu-key", gpu_key, "--quiet", "--duration", "0.5", "--step-ms", "1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_quiet_synth_still_logs_its_join_to_a_file(gpu_key, runtime_dir, tmp_path):
    log = tmp_path / "engine.log"
    with open(log, "wb") as out:
        argv = cli_argv(
            "synth", "--weight", "1", "--gpu-key", gpu_key, "--quiet", "--duration", "0.5", "--step-ms", "1"
        )
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=out, timeout=60)
    assert r.returncode == 0
    assert log.read_text().startswith(f"gpushare-tui: joined /opencoti-gpu-{gpu_key} slot 0"), log.read_text()


def test_quiet_synth_still_says_why_it_failed(runtime_dir):
    r = run_cli("synth", "--weight", "1", "--gpu-key", "bad key!", "--quiet", "--duration", "0.5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r
