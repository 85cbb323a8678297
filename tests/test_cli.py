"""The command line, run as a user would (GPU-less: precompile compiles for sm_90a)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli_command(*args, cache_dir, workers=0, redis=None):
    env = {"CUTEDSL_INDUCTOR_CACHE_DIR": str(cache_dir), "PATH": "/usr/bin:/bin",
           "CUTE_DSL_ARCH": "sm_90a", "HOME": str(cache_dir),
           "CUTEDSL_INDUCTOR_COMPILE_WORKERS": str(workers), **(redis.env() if redis else {})}
    return dict(args=[sys.executable, "-m", "cutedsl_inductor", *args], cwd=ROOT, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cli(*args, cache_dir, workers=0, redis=None):
    return subprocess.run(**cli_command(*args, cache_dir=cache_dir, workers=workers,
                                        redis=redis), timeout=600)


def precompiled(stdout):
    """(compiled, from the local cache, from the remote cache, failed) from precompile's
    summary."""
    found = re.search(r"precompiled \d+ kernel\(s\) in [0-9.]+ s: (\d+) compiled, (\d+) from "
                      r"the local cache, (\d+) from the remote cache, (\d+) failed", stdout)
    return tuple(map(int, found.groups()))


def damage_two_entries(cache_dir):
    """A byte flipped in one entry's object; another's library swapped for a third's."""
    objects = sorted(cache_dir.glob("*/*.o"))
    data = bytearray(objects[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    objects[0].write_bytes(bytes(data))
    libraries = sorted(cache_dir.glob("*/*.so"))
    libraries[-1].write_bytes(libraries[-2].read_bytes())


def tree(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_cache_info_writes_nothing_and_warns_of_a_folder_of_other_files(tmp_path):
    """A cache dir set to a home folder, or to one that does not exist: ``cache info``
    (a read-only command) creates nothing there, not even the cache's secret."""
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    before = tree(home)
    info = cli("cache", "info", cache_dir=home)
    assert info.returncode == 0 and "entries:   0" in info.stdout, info.stderr[-2000:]
    assert tree(home) == before
    assert (f"CuteDSL kernel cache {home} holds 2 name(s) that are not the cache's "
            "('.config', 'notes.txt'): is it the folder meant?") in info.stderr
    missing = tmp_path / "missing"
    info = cli("cache", "info", cache_dir=missing)
    assert info.returncode == 0 and f"cache dir: {missing} (does not exist (yet))" in info.stdout
    assert not missing.exists()


def test_precompile_then_cache_info_then_clear(tmp_path):
    cache_dir = tmp_path / "kernels"
    run = cli("precompile", "--arch", "sm_90a", "--templates", "elementwise", cache_dir=cache_dir)
    assert run.returncode == 0, run.stderr[-2000:]
    assert precompiled(run.stdout) == (9, 0, 0, 0)
    assert "precompile sm_90a" in run.stderr  # the progress bar
    again = cli("precompile", "--templates", "elementwise", cache_dir=cache_dir)
    assert precompiled(again.stdout) == (0, 9, 0, 0)
    info = cli("cache", "info", cache_dir=cache_dir)
    assert f"cache dir: {cache_dir}" in info.stdout and "entries:   9" in info.stdout
    assert "elementwise_add" in info.stdout
    assert "remote:    off (CUTEDSL_INDUCTOR_REMOTE_CACHE=1 turns it on)" in info.stdout
    damage_two_entries(cache_dir)
    assert "CORRUPT" not in cli("cache", "info", cache_dir=cache_dir).stdout  # seals only
    verified = cli("cache", "info", "--verify", cache_dir=cache_dir)
    assert verified.returncode == 1
    flagged = sorted(line.split("CORRUPT: ")[1] for line in verified.stdout.splitlines()
                     if "CORRUPT: " in line)
    assert re.fullmatch(r"library (checksum mismatch|truncated \(\d+ of \d+ bytes\)) "
                        r"\(rebuilt when next needed\)", flagged[0]), flagged
    assert flagged[1] == "object checksum mismatch (rebuilt when next needed)"
    assert ("verified:  7 of 9 entries' files match their manifests; 2 CORRUPT"
            in verified.stdout)
    cleared = cli("cache", "clear", cache_dir=cache_dir)
    assert "removed 9 entries and 0 tuning decisions" in cleared.stdout
    assert "entries:   0" in cli("cache", "info", cache_dir=cache_dir).stdout


def test_precompile_in_two_worker_processes(tmp_path):
    cache_dir = tmp_path / "kernels"
    run = cli("precompile", "--arch", "sm_90a", "--templates", "elementwise",
              cache_dir=cache_dir, workers=2)
    assert run.returncode == 0, run.stderr[-2000:]
    assert precompiled(run.stdout) == (9, 0, 0, 0)
    loaded = cli("precompile", "--templates", "elementwise", cache_dir=cache_dir)
    assert precompiled(loaded.stdout) == (0, 9, 0, 0)  # usable entries


def test_processes_precompiling_one_cache_at_once_count_exactly(tmp_path):
    """Each kernel is compiled once between them, and each says what it did itself; an
    entry that no longer verifies is rebuilt, and counts as compiled."""
    cache_dir = tmp_path / "kernels"
    procs = [subprocess.Popen(**cli_command("precompile", "--templates", "elementwise",
                                            cache_dir=cache_dir)) for _ in range(4)]
    runs = [(p.communicate(timeout=600), p.returncode) for p in procs]
    assert all(code == 0 for _, code in runs), [err[-2000:] for (_, err), _ in runs]
    counts = [precompiled(out) for (out, _), _ in runs]
    assert all(compiled + local == 9 and (remote, failed) == (0, 0)
               for compiled, local, remote, failed in counts)
    assert sum(compiled for compiled, _, _, _ in counts) == 9
    for obj in sorted(cache_dir.glob("*/*.o"))[:3]:
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    again = cli("precompile", "--templates", "elementwise", cache_dir=cache_dir)
    assert precompiled(again.stdout) == (3, 6, 0, 0)


def test_two_machines_share_one_redis(tmp_path, redis_server):
    """Separate local caches: the second compiles nothing, and in its own workers too;
    ``cache info`` shows the tiers."""
    first = cli("precompile", "--templates", "elementwise", cache_dir=tmp_path / "a",
                redis=redis_server)
    assert precompiled(first.stdout) == (9, 0, 0, 0), first.stderr[-2000:]
    second = cli("precompile", "--templates", "elementwise", cache_dir=tmp_path / "b",
                 workers=2, redis=redis_server)
    assert precompiled(second.stdout) == (0, 0, 9, 0), second.stderr[-2000:]
    assert precompiled(cli("precompile", "--templates", "elementwise",
                           cache_dir=tmp_path / "b", redis=redis_server).stdout) == (0, 9, 0, 0)
    info = cli("cache", "info", cache_dir=tmp_path / "b", redis=redis_server).stdout
    assert "entries:   9" in info and "decisions: 0 (tuning decisions)" in info
    assert re.search(rf"remote:    redis://127.0.0.1:{redis_server.port}: reachable \([0-9.]+ "
                     r"ms round trip\)", info)
    assert "this process: kernels 0 local hits, 0 remote hits, 0 compiled;" in info
    redis_server.close()
    info = cli("cache", "info", cache_dir=tmp_path / "b", redis=redis_server).stdout
    assert f"redis://127.0.0.1:{redis_server.port}: NOT reachable (ConnectionError" in info


@pytest.mark.parametrize("args, message", [
    (("--arch", "foo"), "argument --arch: --arch='foo' is not accepted: expected an arch "
                        "CuTe DSL compiles for: sm_80, "),
    (("--templates", "elementwise,gemmm"), "argument --templates: 'gemmm': not a built-in "
                                           "template (one of elementwise, gemm)"),
    (("--gemm-shapes", "64x4096"), "'64x4096' is not MxNxK (positive integers)"),
], ids=["arch", "templates", "gemm_shapes"])
def test_precompile_checks_its_arguments_before_anything_compiles(tmp_path, args, message):
    run = cli("precompile", *args, cache_dir=tmp_path / "kernels")
    assert run.returncode == 2 and run.stdout == ""
    (error,) = [line for line in run.stderr.splitlines() if "error:" in line]
    assert message in error
    assert "Traceback" not in run.stderr and not (tmp_path / "kernels").exists()


def test_precompile_for_sm_90_takes_sm_90a_and_says_so(tmp_path):
    """A process on a Hopper GPU compiles for sm_90a (and the GEMM needs it): kernels for
    sm_90 would never be looked up."""
    run = cli("precompile", "--arch", "sm_90", "--templates", "elementwise",
              cache_dir=tmp_path / "kernels")
    assert run.returncode == 0 and precompiled(run.stdout) == (9, 0, 0, 0), run.stderr[-2000:]
    notes = [line for line in run.stderr.splitlines() if "taken as" in line]
    assert notes == ["--arch sm_90 taken as sm_90a: a process on that GPU compiles for sm_90a "
                     "and looks its kernels up so (set cutedsl_inductor.config.arch='sm_90' "
                     "there to use sm_90)"]
    assert "precompile sm_90a" in run.stderr


def test_precompile_says_which_template_offered_nothing_for_its_arch(tmp_path):
    run = cli("precompile", "--arch", "sm_80", "--templates", "gemm",
              cache_dir=tmp_path / "kernels")
    assert run.returncode == 1 and precompiled(run.stdout) == (0, 0, 0, 0)
    assert ("  NOTHING from gemm: it offers no choice for sm_80 (an arch its kernels do not "
            "support, or these shapes)") in run.stdout.splitlines()


A_FILE = str(ROOT / "README.md")


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: COMMAND"),
    (["nope"], "argument COMMAND: invalid choice: 'nope'"),
    (["cache", "nope"], "argument action: invalid choice: 'nope'"),
    (["precompile", "--templates", "nope"], "'nope': not a built-in template"),
    (["bench"], "the following arguments are required: BENCH"),
    (["bench", "gemm", "--merge", "/nonexistent"],
     "'/nonexistent': cannot read /nonexistent (No such file or directory)"),
    (["bench", "gemm", "--merge", A_FILE],
     "is not a bench gemm CSV (without the column(s) m, n, k, dtype, layout, config"),
    (["bench", "gemm", "--dtypes", "bf16,fp4"], "'fp4': not a dtype (one of bf16, fp16, fp8)"),
    (["bench", "gemm", "--scales", "blockwise"],
     "'blockwise': not a scale recipe (one of tensorwise, rowwise)"),
    (["bench", "gemm", "--layouts", "tn"], "'tn': not a layout (one of nt, nn)"),
    (["bench", "epilogue", "--out", f"{A_FILE}/out"], "cannot make that folder"),
    (["bench", "sweep"], "the following arguments are required: --shapes"),
    (["bench", "sweep", "--shapes", "64x64x64", "--variant", "tile_q=1"],
     "'tile_q' is not a GEMM config field (one of tile_m, "),
    (["bench", "sweep", "--shapes", "64x64x64", "--ranked", "0"], "'0' is not a positive integer"),
    (["bench", "model", "--layers", "0"], "'0' is not a positive integer"),
    (["bench", "attention", "--shapes", "8x16"], "'8x16' is not BxHxS (positive integers)"),
    (["bench", "launch", "--out", A_FILE], "cannot make that folder"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_a_wrong_argument_is_one_error_line_before_anything_runs(argv, message, capsys):
    from cutedsl_inductor.cli import main

    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert message in error


def test_bench_alone_is_a_usage_error_as_a_user_runs_it(tmp_path):
    run = cli("bench", cache_dir=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1] == ("python -m cutedsl_inductor bench: error: the "
                                           "following arguments are required: BENCH")


def test_bench_help_lists_every_benchmark_and_version_names_the_toolchain(capsys):
    from cutedsl_inductor import __version__
    from cutedsl_inductor.cli import BENCHES, main

    with pytest.raises(SystemExit) as exit:
        main(["bench", "--help"])
    assert exit.value.code == 0
    listed = capsys.readouterr().out
    # a name longer than argparse's help column has its summary on the next line
    assert all(re.search(rf"^    {name}(?: +|\n +)\w", listed, re.M) for name in BENCHES)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert re.fullmatch(rf"cutedsl-inductor {re.escape(__version__)} \(torch 2\.\d+\S*, "
                        r"nvidia-cutlass-dsl 4\.8\.\d+, apache-tvm-ffi 0\.1\.15\S*\)\n",
                        capsys.readouterr().out)


def test_a_read_only_cache_is_not_cleared(tmp_path):
    cache_dir = tmp_path / "kernels"
    (cache_dir / "ab").mkdir(parents=True)
    (cache_dir / "secret").write_bytes(b"0" * 32)
    (cache_dir / "secret").chmod(0o400)
    from tests.helpers import run_unprivileged

    cache_dir.chmod(0o555)
    run = run_unprivileged(**{**cli_command("cache", "clear", cache_dir=cache_dir),
                              "timeout": 120})
    assert run.returncode == 1
    assert f"not clearing {cache_dir}: it is not writable: used read-only" in run.stderr


BEFORE_ROUNDS = "m,n,k,dtype,layout,config,ours,cublas,triton,vs_cublas,vs_triton"
WITH_ROUNDS = BEFORE_ROUNDS + ",vs_cublas_min,vs_cublas_max,vs_triton_min,vs_triton_max"


def write_shard(directory, header, row):
    directory.mkdir()
    (directory / "gemm_bench.csv").write_text(header + "\n" + row + "\n")


def test_bench_gemm_merges_shards(tmp_path):
    """A shard from before the interleaved rounds (no ratio ranges) merges with newer ones."""
    write_shard(tmp_path / "a", BEFORE_ROUNDS,
                "16,4096,4096,bf16,nt,CuteDSL sm90_gemm (A),24.0,30.0,27.0,0.8,0.889")
    write_shard(tmp_path / "b", WITH_ROUNDS,
                "4096,4096,4096,fp16,nn,CuteDSL sm90_gemm (B),800.0,640.0,nan,1.25,nan,"
                "1.2,1.3,nan,nan")
    write_shard(tmp_path / "c", WITH_ROUNDS,
                "64,4096,4096,bf16,nn,CuteDSL sm90_gemm (C),100.0,100.0,98.0,1.0,1.02,"
                "0.99,1.01,0.99,1.03")
    run = cli("bench", "gemm", "--merge", *(str(tmp_path / d) for d in "abc"),
              "--out", str(tmp_path / "merged"), cache_dir=tmp_path / "kernels")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "geomean vs cuBLAS 1.000 over 3 shapes; worst 0.80 at 16x4096x4096 bf16 nt" in run.stdout
    assert "above Inductor's best Triton on 1 of 2 shapes" in run.stdout
    assert "in every round on 0 of the 1 timed in rounds" in run.stdout
    assert " 1.250 1.20-1.30 " in run.stdout  # the ratio's range over the rounds
    merged = (tmp_path / "merged" / "gemm_bench.csv").read_text().splitlines()
    assert merged[0] == WITH_ROUNDS + ",gpu,torch,cute_dsl" and len(merged) == 4


def test_bench_rounds_are_checked_before_any_run(tmp_path):
    for bench in ("gemm", "epilogue"):
        run = cli("bench", bench, "--rounds", "0", cache_dir=tmp_path)
        assert run.returncode == 2
        assert "'0' is not a positive number of rounds" in run.stderr


def test_bench_gemm_shapes(tmp_path):
    from cutedsl_inductor.bench.args import parse_shapes

    assert parse_shapes("16x4096x14336,1024X1024x1024") == [(16, 4096, 14336), (1024, 1024, 1024)]
    run = cli("bench", "gemm", "--shapes", "128x4096x4096,64x4096", cache_dir=tmp_path)
    assert run.returncode == 2
    assert "'64x4096' is not MxNxK (positive integers)" in run.stderr


def test_bench_shards_are_checked_before_any_run(tmp_path):
    from cutedsl_inductor.bench.args import parse_shard

    assert parse_shard("2/4") == (2, 4)
    for bench in ("gemm", "epilogue"):
        run = cli("bench", bench, "--shard", "3/2", cache_dir=tmp_path)
        assert run.returncode == 2
        assert "'3/2' is not K/N with 1 <= K <= N" in run.stderr


def test_bench_epilogue_names_the_gemm_configs_of_output_code():
    from cutedsl_inductor.bench.epilogue import gemm_configs
    from cutedsl_inductor.compile.records import KernelSource
    from cutedsl_inductor.inductor.scheduling import kernel_definition
    from cutedsl_inductor.kernels.gemm.config import GemmConfig
    from cutedsl_inductor.kernels.gemm.template import _params

    coop = dict(tile_m=128, tile_n=256, cluster_m=2, cooperative=True)
    split = dict(tile_m=64, tile_n=128, cooperative=False, split_k=2)
    code = "\n".join(kernel_definition(KernelSource.of(
                         f"k{i}", "source", [], "sm90_gemm",
                         _params(GemmConfig(**cfg), False, 1.0, 0.0)))
                     for i, cfg in enumerate((coop, split)))
    assert gemm_configs(code) == "128x256x64 c2x1 coop, 64x128x64 c1x1 1wg k2"


SCRIPT = ("import atexit, sys, cutedsl_inductor_cli\n"
          "atexit.register(lambda: print('IMPORTED', sorted(m for m in ('torch', 'cutlass')"
          " if m in sys.modules), file=sys.stderr))\n"
          "sys.exit(cutedsl_inductor_cli.main())\n")


@pytest.mark.parametrize("args, says", [(["--help"], "precompile"), (["--version"], "torch"),
                                        (["cache", "info"], "entries:   0"),
                                        (["cache", "clear"], "removed 0 entries"),
                                        (["bench", "--help"], "launch")])
def test_the_script_answers_without_importing_torch(tmp_path, args, says):
    """What the ``cutedsl-inductor`` script runs: these answer in a fraction of a second
    because neither torch nor CuTe DSL is imported (its ``--version`` reads torch's from
    the installed metadata)."""
    command = cli_command(*args, cache_dir=tmp_path / "kernels")
    command["args"] = [sys.executable, "-c", SCRIPT, *args]
    run = subprocess.run(**command, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert says in run.stdout and "IMPORTED []" in run.stderr


def test_a_command_that_compiles_loads_the_package_first(tmp_path):
    """The script defers the package's load; ``precompile`` loads it (torch, Inductor, our
    passes) before it compiles, and a name of the package loads it too."""
    command = cli_command("precompile", "--templates", "elementwise",
                          cache_dir=tmp_path / "kernels")
    command["args"] = [sys.executable, "-c", SCRIPT, *command["args"][3:]]
    run = subprocess.run(**command, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert precompiled(run.stdout) == (9, 0, 0, 0) and "IMPORTED ['cutlass', 'torch']" in run.stderr
    code = ("import os, cutedsl_inductor_cli, cutedsl_inductor as c\n"
            "assert not c._loaded and 'torch' not in __import__('sys').modules\n"
            "c.CuteDSLTemplate\n"
            "from torch._inductor.codegen import common\n"
            "print(c._loaded, type(common.custom_backend_passes['cuda']).__name__)\n")
    env = {**command["env"], "_CUTEDSL_INDUCTOR_DEFER_LOAD": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.split() == ["True", "SwiGLUPass"], run.stderr[-2000:]


def test_the_launcher_and_the_package_agree_on_the_deferral_variable():
    import cutedsl_inductor
    import cutedsl_inductor_cli

    assert cutedsl_inductor_cli._DEFER_ENV == cutedsl_inductor.DEFER_ENV
