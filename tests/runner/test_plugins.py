"""Avalanche plugins a suite attaches through ``benchmarks.run`` (strategies/plugins.py): they act
inside the suite's task-aware stream, enter the run's config, and every misuse is one line."""

import pytest

from benchmarks import run
from tests.helpers import run_one_run_suite, three_task_suite

TINY = "batch_size = 16\neval_batch_size = 64\nepochs = 2\nlr = 0.01\n"

COUNTER = '''
from avalanche.core import SupervisedPlugin


class CountTasks(SupervisedPlugin):
    """A user's plugin: writes the tasks it saw trained to a file."""

    def __init__(self, path):
        super().__init__()
        self.path, self.tasks = path, []

    def after_training_exp(self, strategy, *args, **kwargs):
        self.tasks.append(sorted(int(c) for c in strategy.experience.classes_in_this_experience))
        open(self.path, "w").write(repr(self.tasks))
'''


def _stages(tmp_path, name: str, options: str):
    folder = tmp_path / name.replace(":", "_")
    folder.mkdir(parents=True)
    *_, result = run_one_run_suite(folder, three_task_suite(name, TINY + options))
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "plugin, template, options",
    [("ReplayPlugin", "Replay", {"mem_size": 30}), ("LwFPlugin", "LwF", {"alpha": 2.0, "temperature": 2.0})],
)
def test_a_plugin_on_naive_is_avalanches_own_strategy(tmp_path, plugin, template, options):
    """Avalanche's Replay and LwF are Naive plus these plugins: through the runner the numbers agree."""
    inline = ", ".join(f"{k} = {v}" for k, v in options.items())
    with_plugin = _stages(tmp_path / "a", "avalanche:Naive", f"plugins = {{ {plugin} = {{ {inline} }} }}\n")
    own = _stages(
        tmp_path / "b", f"avalanche:{template}", "".join(f"{k} = {v}\n" for k, v in options.items())
    )
    assert with_plugin["stages"] == own["stages"]
    assert with_plugin["config"]["plugins"] == {plugin: options} and "plugins" not in own["config"]


@pytest.mark.slow
def test_a_users_plugin_runs_inside_a_clip_strategy(tmp_path, monkeypatch):
    (tmp_path / "user_plugins.py").write_text(COUNTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = tmp_path / "seen.txt"
    result = _stages(
        tmp_path, "finetune", f'plugins = {{ "user_plugins:CountTasks" = {{ path = "{seen}" }} }}\n'
    )
    assert eval(seen.read_text()) == [sorted(t) for t in result["tasks"]]
    assert result["config"]["plugins"] == {"user_plugins:CountTasks": {"path": str(seen)}}


@pytest.mark.parametrize(
    "strategy, options, says",
    [
        ("finetune", "plugins = { ReplayPlugin = { mem_size = 30 } }", "run avalanche:Replay"),
        ("gr4cil", "plugins = ['LwFPlugin']", "cannot take LwFPlugin"),
        ("finetune", "plugins = ['NoSuchPlugin']", "module 'avalanche.training.plugins'"),
        ("finetune", "plugins = { ReplayPlugin = { memory = 3 } }", "plugin ReplayPlugin does not take"),
        ("finetune", "plugins = 'ReplayPlugin'", "must be a list of plugin names or a table"),
        ("finetune", "plugins = ['torch.nn:Linear']", "is not an Avalanche plugin"),
    ],
)
def test_a_plugin_that_cannot_work_is_one_line(tmp_path, capsys, strategy, options, says):
    suite = tmp_path / "suite.toml"
    suite.write_text(three_task_suite(strategy, TINY + options.replace("'", '"') + "\n"))
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert not list((tmp_path / "r").rglob("*.json"))


@pytest.mark.parametrize(
    "options, says",
    [
        ('{ ReplayPlugin = { mem_size = "lots" } }', "option mem_size must be a whole number, not 'lots'"),
        ("{ ReplayPlugin = { mem_size = -5 } }", "option mem_size must not be negative, not -5"),
        ("{ ReplayPlugin = { mem_size = 2.5 } }", "option mem_size must be a whole number, not 2.5"),
        ("{ ReplayPlugin = { task_balanced_dataloader = 1 } }", "must be true or false, not 1"),
        ("{ LwFPlugin = { alpha = -1.0 } }", "option alpha must not be negative"),
        ('{ LwFPlugin = { temperature = "hot" } }', "option temperature must be a whole number or a number"),
        (
            "{ GEMPlugin = { memory_strength = 0.5 } }",
            "missing a required argument: 'patterns_per_experience'",
        ),
    ],
)
def test_plugin_options_of_the_wrong_type_or_sign_are_one_line_when_the_suite_is_read(
    tmp_path, capsys, options, says
):
    """Checked against the plugin's signature before any run starts (not inside Avalanche during
    task 1), naming the option and the suite table."""
    suite = tmp_path / "suite.toml"
    suite.write_text(three_task_suite("avalanche:Naive", TINY + f"plugins = {options}\n"))
    results = tmp_path / "r"
    assert run.main(["--suite", str(suite), "--results-dir", str(results), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: plugin ") and says in err[0], err
    assert '[strategy."avalanche:Naive"]' in err[0], err
    assert not results.exists() or not list(results.rglob("*.json"))


def test_plugin_options_that_fit_pass_the_check():
    from strategies.plugins import plugin_table

    table = {"ReplayPlugin": {"mem_size": 30, "batch_size": 8}, "LwFPlugin": {"alpha": 0.5, "temperature": 2}}
    assert plugin_table(table, "finetune", "[strategy.finetune]") == table
