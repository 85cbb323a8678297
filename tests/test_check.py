"""``cutedsl-inductor check``: a template author's GPU-less route. The README's template
(and a broken copy) written to a file as a user would, checked through the public function
and the command: real renders and compiles for sm_90a, no kernel cache touched."""

import re
import subprocess
import sys

import pytest
import torch

from cutedsl_inductor.check import check_template, load_template
from cutedsl_inductor.exc import CheckTargetError
from tests.test_cli import cli_command
from tests.test_readme import quick_start_code

SOURCE = re.search(r"SRC = r'''(.*?)'''", quick_start_code(), re.S).group(1)
BROKEN = SOURCE.replace("gC[i] = gA[i] + gB[i]", "gC[i] = gA[i] + gB[i] + undefined_name")


def template_file(folder, name, source, variable="TEMPLATE"):
    path = folder / f"{name}.py"
    path.write_text("from cutedsl_inductor import CuteDSLTemplate\n\n"
                    f"{variable} = CuteDSLTemplate({name!r}, r'''{source}''')\n")
    return path


def test_each_parameter_set_reports_its_kernels_needs(tmp_path, kernel_cache_dir):
    template = load_template(f"{template_file(tmp_path, 'check_add', SOURCE)}:TEMPLATE")
    reports = check_template(template, [(1024, 1000), (1024, 1000)],
                             [{"THREADS_PER_BLOCK": 128}, {"THREADS_PER_BLOCK": 256}],
                             dtype=torch.float32)
    assert [r.params for r in reports] == [{"THREADS_PER_BLOCK": 128}, {"THREADS_PER_BLOCK": 256}]
    for report in reports:
        assert report.error is None and report.name.startswith("cutedsl_check_add_")
        (kernel,) = report.kernels
        assert 0 < kernel.registers < 64 and kernel.spills is False
        assert kernel.dynamic_smem_bytes == 0 and kernel.static_smem_bytes == 0
        assert re.fullmatch(r"cutedsl_check_add_\w+ \[THREADS_PER_BLOCK=\d+\]\n  \d+ "
                            r"registers, shared memory 0 B dynamic \+ 0 B static, stack 0 B, "
                            r"no spills: kernel_\w+", str(report))
    assert not kernel_cache_dir.exists() or not any(kernel_cache_dir.iterdir())  # nothing cached


def test_a_kernel_that_does_not_compile_reports_the_generated_line(tmp_path):
    template = load_template(f"{template_file(tmp_path, 'check_broken', BROKEN)}:TEMPLATE")
    (report,) = check_template(template, [(256,), (256,)], [{"THREADS_PER_BLOCK": 128}])
    assert report.kernels == () and "undefined_name" in report.error
    path, line = report.where.rsplit(":", 1)
    assert "undefined_name" in open(path).read().splitlines()[int(line) - 1]
    assert "\x1b[" not in report.error


def test_a_template_that_does_not_render_reports_why(tmp_path):
    source = SOURCE.replace("{{gen_defines()}}", "{{gen_defines()}}\n{{no_such_hook()}}")
    template = load_template(f"{template_file(tmp_path, 'check_hook', source)}:TEMPLATE")
    (report,) = check_template(template, [(256,), (256,)], [{"THREADS_PER_BLOCK": 128}])
    assert report.name is None and "no_such_hook" in report.error
    assert str(report).startswith("FAILED (not rendered) [THREADS_PER_BLOCK=128]: "
                                  "TemplateRenderError")


@pytest.mark.parametrize("target, cause", [("nofile.py:T", "no file nofile.py"),
                                           ("{folder}/t.py", "not of the form FILE.py:NAME"),
                                           ("{folder}/t.py:SOURCE", "SOURCE in .* is str")])
def test_a_target_that_names_no_template_is_refused(tmp_path, target, cause):
    template_file(tmp_path, "t", SOURCE, variable="T")
    (tmp_path / "t.py").write_text((tmp_path / "t.py").read_text() + "SOURCE = 'text'\n")
    with pytest.raises(CheckTargetError, match=cause):
        load_template(target.format(folder=tmp_path))


def test_the_command_prints_a_report_per_choice_and_fails_if_one_fails(tmp_path):
    good = template_file(tmp_path, "cli_add", SOURCE)
    run = subprocess.run(**cli_command(
        "check", f"{good}:TEMPLATE", "--shapes", "100x30,100x30", "--dtype", "float16",
        "--param", "THREADS_PER_BLOCK=128,256", cache_dir=tmp_path / "cache"), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(re.findall(r"\d+ registers, shared memory", run.stdout)) == 2
    assert run.stdout.strip().endswith("2 of 2 choice(s) compiled for sm_90a")
    broken = template_file(tmp_path, "cli_broken", BROKEN)
    run = subprocess.run(**cli_command(
        "check", f"{broken}:TEMPLATE", "--shapes", "100x30,100x30",
        "--param", "THREADS_PER_BLOCK=128", cache_dir=tmp_path / "cache"), timeout=600)
    assert run.returncode == 1 and "FAILED cutedsl_cli_broken_" in run.stdout
    assert re.search(r"\n  at \S+\.py:\d+\n", run.stdout)


def test_the_command_refuses_bad_arguments_before_anything_runs(tmp_path):
    for args, message in [(["--shapes", "10xa"], "'10xa' is not a shape"),
                          (["--shapes", "10", "--param", "X"], "'X' is not NAME=VALUE"),
                          (["--shapes", "10", "--arch", "sm90"], "sm90")]:
        run = subprocess.run(**cli_command("check", "t.py:T", *args,
                                           cache_dir=tmp_path), timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr
