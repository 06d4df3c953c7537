"""Packaging: no hard TensorFlow requirement, extras that pick one, the
import-time version check, and the commands the README and CI run."""
import os
import re

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from conftest import ROOT, script_env
from fresh_python import fresh_python
from pyfunc_bridge import _library

TF_DISTRIBUTIONS = re.compile(r"^(tensorflow|tensorflow-cpu|tensorflow_cpu|tf-nightly)\b", re.I)


@pytest.fixture(scope="module")
def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def _names(requirements):
    return [re.split(r"[\[=<>!~ ;]", r, maxsplit=1)[0] for r in requirements]


def test_no_tensorflow_distribution_is_a_runtime_requirement(project):
    deps = project["project"]["dependencies"]
    assert not [d for d in deps if TF_DISTRIBUTIONS.match(d)], deps


def test_extras_pick_one_distribution(project):
    extras = project["project"]["optional-dependencies"]
    assert extras["cpu"] == ["tensorflow-cpu==2.21.*"]
    assert _names(extras["gpu"]) == ["tensorflow"]
    assert extras["gpu"][0].endswith("==2.21.*")


@pytest.mark.parametrize("extra", ["test", "bench"])
def test_test_and_bench_extras_use_the_cpu_extra(project, extra):
    requirements = project["project"]["optional-dependencies"][extra]
    assert "pyfunc_bridge[cpu]" in requirements
    assert not [r for r in requirements if TF_DISTRIBUTIONS.match(r)]


def test_build_requirement_stays_tensorflow_cpu(project):
    assert "tensorflow-cpu==2.21.*" in project["build-system"]["requires"]


def _readme_commands(readme):
    return [line.strip() for line in readme.splitlines()
            if line.startswith("    python3 -m venv .venv")]


def test_readme_commands_install_the_cpu_extra(readme):
    commands = _readme_commands(readme)
    assert len(commands) == 2
    for command in commands:
        extras = re.search(r'pip install -e "\.\[([^\]]*)\]"', command).group(1).split(",")
        assert "cpu" in extras, command


def test_ci_runs_the_readme_test_command_and_the_wheel(readme):
    (test_command,) = [c for c in _readme_commands(readme) if "pytest" in c]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        script = f.read()
    # Each leg is the README's command in a venv of its own Python.
    steps = [re.sub(r"\.venv/bin/|\.venv\b", "", step).strip()
             for step in test_command.split("&&")]
    assert steps == ["python3 -m venv", 'pip install -e ".[cpu,test]"', "python -m pytest"]
    assert '-m venv "$venv"' in script
    # (with the docs extra, for the site's build and its examples)
    assert '"$venv/bin/pip" install -e ".[cpu,test,docs]"' in script
    assert '"$venv/bin/python" -m pytest' in script
    assert '"$venv/bin/python" -m sphinx -W -b html docs docs/_build/html' in script
    assert '"$venv/bin/python" -m sphinx -W -b doctest docs docs/_build/doctest' in script
    # One leg runs it; the other tests what users install, the wheel.
    legs = re.findall(r"^(leg|wheel_leg) (3\.\d+) (2\.\d+)$", script, re.M)
    assert legs == [("leg", "3.11", "2.4"), ("wheel_leg", "3.12", "2.5")]
    assert 'tools/test_wheel.sh "$1" "$2"' in script
    assert "3.11" in readme and "3.12" in readme


def _import_in_subprocess(prelude):
    """`prelude`, then `import pyfunc_bridge` in a fresh interpreter."""
    code = prelude + "\nimport pyfunc_bridge\nprint('IMPORTED')\n"
    return fresh_python(code, timeout=120, cwd=ROOT,
                        env=script_env(ROOT, TF_CPP_MIN_LOG_LEVEL="2"))


def test_import_without_tensorflow_names_both_extras():
    # None in sys.modules makes `import tensorflow` fail as if it were missing.
    proc = _import_in_subprocess("import sys; sys.modules['tensorflow'] = None")
    assert proc.returncode != 0
    assert "IMPORTED" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pyfunc_bridge needs TensorFlow 2.21.x")
    assert "pyfunc_bridge[cpu]" in last and "pyfunc_bridge[gpu]" in last


def test_import_with_another_tensorflow_version_says_how_to_fix_it():
    proc = _import_in_subprocess("import tensorflow as tf; tf.__version__ = '2.20.3'")
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: pyfunc_bridge needs TensorFlow 2.21.x")
    assert "2.20.3" in message
    assert _library.installed_distributions() in message  # e.g. "tensorflow-cpu 2.21.0"
    assert "pip install --no-build-isolation -e ." in message


def test_installed_distribution_is_named_by_project_and_version():
    import tensorflow as tf
    named = _library.installed_distributions()
    assert re.fullmatch(r"(tensorflow(-cpu)?|tf-nightly\S*) \S+( and .+)?", named), named
    assert tf.__version__.split("+")[0] in named


@pytest.mark.parametrize("version", ["2.21.0", "2.21.7", "2.21.0rc1"])
def test_any_patch_release_of_the_built_minor_version_passes(version):
    assert _library.check_tensorflow_version(version) is None


@pytest.mark.parametrize("version", ["2.20.0", "2.22.0", "3.21.0"])
def test_another_minor_version_fails(version):
    with pytest.raises(ImportError, match=re.escape(version)):
        _library.check_tensorflow_version(version)
