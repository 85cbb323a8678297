"""``benchmarks/aot_debug.py`` without a GPU: the package without our kernels built, loaded
and called in a fresh process where CuTe DSL does not import, and loaded again as a
given package; a child that dies of a
signal gets its backtrace (gdb) and its last opened libraries (LD_DEBUG); the stripped
package loses exactly the shipped ``.cutedsl`` files."""

import shutil
import sys
import zipfile

from benchmarks.aot_debug import main, report, stripped


def test_on_a_cpu_the_package_without_ours_loads_and_matches_in_a_fresh_process(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    main(["--device", "cpu", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("aten_const: rc")]
    assert line.startswith("aten_const: rc 0 {") and '"ok": true' in line, out
    main(["--given-only", "--out", str(tmp_path / "again"),
          str(tmp_path / "out" / "aten_const.pt2")])
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith("aten_const")]  # no build
    (line,) = [line for line in out.splitlines() if line.startswith("given_0: rc")]
    assert line.startswith('given_0: rc 0 {"load_s": '), out


def test_a_child_killed_by_a_signal_is_diagnosed(tmp_path, capsys):
    report("crash", [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], tmp_path)
    out = capsys.readouterr().out
    assert out.startswith("crash: rc -11 no answer")
    if shutil.which("gdb"):
        assert "gdb: Program received signal SIGSEGV" in out
        assert "string_at" in out  # the faulting frame's caller, in the backtrace
    assert "LD_DEBUG: calling init: " in out  # the libraries opened before it


def test_the_stripped_package_drops_only_the_shipped_files(tmp_path):
    names = ["m/data/aotinductor/model/a.wrapper.so", "m/data/aotinductor/model/k.cutedsl",
             "m/data/aotinductor/model/libtvm_ffi.so.cutedsl", "m/archive_format"]
    with zipfile.ZipFile(tmp_path / "p.pt2", "w") as archive:
        for name in names:
            archive.writestr(name, name)
    result = stripped(tmp_path / "p.pt2", tmp_path / "s.pt2")
    with zipfile.ZipFile(result) as archive:
        assert archive.namelist() == [names[0], names[3]]
        assert archive.read(names[0]) == names[0].encode()

