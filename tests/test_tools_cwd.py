"""Every tool runs from any working directory without changing sys.path: the project's
``trainers`` and ``datasets`` come from vlprompt_app.project."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vlprompt_app import project

ROOT = Path(__file__).resolve().parents[1]
TOOLS = sorted(path.name for path in (ROOT / "tools").glob("*.py"))
# An assignment to sys.path or a call of one of its list methods.
SYS_PATH_CHANGE = re.compile(r"sys\.path\s*(\[[^\]]*\]\s*)?\+?=(?!=)"
                             r"|sys\.path\.(insert|append|extend|remove|pop|clear)\b")


def test_no_file_of_the_project_changes_sys_path():
    """Tools, train.py, the packages and the tests import through installed packages and
    vlprompt_app.project; this file is left out, since it spells the changes it looks for."""
    files = [ROOT / "train.py"] + [path for folder in ("tools", "vlprompt", "vlprompt_app", "trainers", "datasets", "tests")
                                   for path in sorted((ROOT / folder).rglob("*.py"))]
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in files if path != Path(__file__).resolve()
                 for number, line in enumerate(path.read_text().splitlines(), 1) if SYS_PATH_CHANGE.search(line)]
    assert offenders == []


def test_the_sys_path_check_catches_each_kind_of_change():
    changes = ["sys.path.insert(0, ROOT)", "sys.path.append(str(REPO))", "sys.path[:0] = [ROOT]",
               "sys.path = [ROOT] + sys.path", "sys.path += [ROOT]", "sys.path.extend(folders)"]
    assert all(SYS_PATH_CHANGE.search(line) for line in changes)
    assert not any(SYS_PATH_CHANGE.search(line) for line in ["if ROOT not in sys.path:", "print(sys.path[0])",
                                                             "sys.path == before"])


def installed_environment(folder):
    """The environment of a user with an editable install of this checkout: ``vlprompt`` is
    importable (through a link in ``folder``/site), ``trainers`` and ``datasets`` are not."""
    site = Path(folder, "site")
    site.mkdir(exist_ok=True)
    if not (site / "vlprompt").exists():
        (site / "vlprompt").symlink_to(ROOT / "vlprompt", target_is_directory=True)
    return dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1")


# Runs the commands given as JSON on its command line ([[name, script, [args], cwd], ...]) as
# ``python SCRIPT ARGS`` would from ``cwd``, each in a process forked from this interpreter (its
# environment is the caller's): sys.argv and sys.path[0] (the script's folder) as Python sets them,
# stdout and stderr to files; prints {name: [exit status, stdout, stderr]} as JSON. It imports torch,
# torchvision, open_clip and the installed library's engine and data modules once before forking
# (what made each fresh interpreter cost seconds; open_clip through vlprompt.clip, which defers
# transformers as it does in a tool): the project's ``trainers`` and ``datasets`` and the
# application are imported by each tool in its own process.
DRIVER = r"""
import json, os, runpy, shutil, sys, tempfile, traceback
import torch, torchvision, vlprompt.clip, open_clip, vlprompt.engine, vlprompt.data  # noqa: F401

outputs, results = tempfile.mkdtemp(), {}
for name, script, args, cwd in json.loads(sys.argv[1]):
    out, err = (os.path.join(outputs, str(len(results)) + kind) for kind in (".out", ".err"))
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.chdir(cwd)
        sys.argv, sys.path[0], code = [script, *args], os.path.dirname(script), 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    results[name] = [os.waitstatus_to_exitcode(status), open(out).read(), open(err).read()]
shutil.rmtree(outputs)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The commands of this file's tests, each from its own empty folder, as a user with only
    ``vlprompt`` importable (see installed_environment) runs them: {name: CompletedProcess} and
    {folder name: folder}. One driver interpreter starts them all (see DRIVER)."""
    import json

    base = tmp_path_factory.mktemp("tools_cwd")
    folders = {name: base / name for name in ("help", "benchmark", "protocol")}
    for folder in folders.values():
        folder.mkdir()
    benchmark, protocol = folders["benchmark"], folders["protocol"]
    commands = [[f"--help {script.name}", str(script), ["--help"], str(folders["help"])]
                for script in [ROOT / "tools" / name for name in TOOLS] + [ROOT / "train.py"]]
    commands += [
        ["check_datasets", str(ROOT / "tools" / "check_datasets.py"),
         ["--root", str(benchmark / "data"), "--datasets", "OxfordPets"], str(benchmark)],
        ["benchmark show", str(ROOT / "tools" / "benchmark.py"), ["show", "missing.json"], str(benchmark)],
        ["benchmark dear", str(ROOT / "tools" / "benchmark.py"), ["dear", "--config-file", "missing.yaml"],
         str(benchmark)],
        ["run_protocol", str(ROOT / "tools" / "run_protocol.py"),
         ["--benchmark", "synthetic", "--protocol", "base2new", "--root", str(protocol / "data"),
          "--output", str(protocol / "out"), "--trainers", "CoOp", "RAda:synthetic_mlp", "--config", "synthetic",
          "--seeds", "1", "--dry-run"], str(protocol)],
    ]
    driver = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], cwd=base,
                            env=installed_environment(base), capture_output=True, text=True, timeout=600)
    assert driver.returncode == 0, driver.stderr[-3000:]
    results = {name: subprocess.CompletedProcess(name, status, out, err)
               for name, (status, out, err) in json.loads(driver.stdout).items()}
    assert sorted(results) == sorted(command[0] for command in commands)
    return results, folders


@pytest.mark.e2e
def test_every_tool_and_train_py_answer_help_from_another_directory(runs):
    """Each in a process of its own (forked from one interpreter that imported torch; see DRIVER):
    a failure names the tool. The harness's tools show their --official-git option."""
    results, folders = runs
    helps = {name.split(" ", 1)[1]: result for name, result in results.items() if name.startswith("--help ")}
    assert sorted(helps) == sorted(TOOLS + ["train.py"])
    failed = {name: result.stderr.strip().splitlines()[-3:] for name, result in helps.items()
              if result.returncode != 0 or "usage:" not in result.stdout}
    assert failed == {}
    assert all("--official-git" in helps[name].stdout
               for name in ("official_equivalence.py", "official_wiseft.py", "official_benchmark.py"))
    assert os.listdir(folders["help"]) == []  # --help writes nothing


@pytest.mark.e2e
def test_a_benchmark_runs_from_another_directory(runs):
    """Real (cheap) invocations: the dataset registry comes from the project's datasets/, the
    benchmark's default config path from the repository root."""
    results, _ = runs
    result = results["check_datasets"]
    assert result.returncode == 1 and 'OxfordPets           MISSING  no folder "oxford_pets"' in result.stdout
    assert result.stderr == ""
    result = results["benchmark show"]
    assert result.returncode == 2 and result.stderr.startswith("error: cannot read the report: ")
    assert "missing.json" in result.stderr
    result = results["benchmark dear"]
    assert result.returncode == 2 and "missing.yaml" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.e2e
def test_run_protocol_expands_a_grid_from_another_directory(runs):
    """A real invocation past argument parsing: the trainers (and their configs) are resolved
    from the repository root, not from the working directory."""
    results, folders = runs
    result = results["run_protocol"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "configs/trainers/RAda/synthetic_mlp.yaml" in result.stdout
    assert not (folders["protocol"] / "out").exists()  # a dry run writes nothing


def test_project_packages_are_loaded_from_the_repository_root():
    trainers, datasets = project.import_project()
    assert Path(trainers.__file__) == project.repository_root() / "trainers" / "__init__.py"
    assert Path(datasets.__file__) == project.repository_root() / "datasets" / "__init__.py"
    assert project.import_project_package("trainers") is trainers  # imported once
    assert sys.modules["trainers.dear"].__file__.startswith(str(project.repository_root() / "trainers"))


def test_a_root_without_the_packages_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "datasets")
    with pytest.raises(project.ProjectLayoutError, match=r"expected at .*datasets/__init__.py.*vlprompt/, trainers/ "
                                                         r"and datasets/ side by side"):
        project.import_project_package("datasets", tmp_path)
    assert "datasets" not in sys.modules


def test_another_module_of_the_same_name_is_reported(tmp_path, monkeypatch):
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "__init__.py").write_text("")
    with pytest.raises(project.ProjectLayoutError, match="already imported from"):
        project.import_project_package("datasets", tmp_path)


def test_a_package_that_fails_to_import_is_not_left_half_loaded(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "trainers")
    (tmp_path / "trainers").mkdir()
    (tmp_path / "trainers" / "__init__.py").write_text("raise RuntimeError('broken trainer package')\n")
    with pytest.raises(RuntimeError, match="broken trainer package"):
        project.import_project_package("trainers", tmp_path)
    assert "trainers" not in sys.modules
