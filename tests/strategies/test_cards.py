"""Each method's card (``strategies/methods/<name>.toml``, read by ``strategies.cards``): one per
method file, read without importing the method, and the one source the report, the figures, the
as-published protocol and the GPU check read a method's facts from."""

import subprocess
import sys
from pathlib import Path

import pytest

from strategies.cards import MethodCard, read_card
from strategies.cards import cards as all_cards

TESTS = Path(__file__).resolve().parents[1]


def test_every_method_file_has_a_card_and_every_card_a_method():
    from strategies.registry import available

    assert list(all_cards()) == available()
    for name, card in all_cards().items():
        assert isinstance(card, MethodCard) and card.name == name and card.title and card.recipe


def test_each_card_names_test_modules_that_exist():
    modules = {path.stem for path in TESTS.rglob("test_*.py")}
    for card in all_cards().values():
        assert card.tests and set(card.tests) <= modules, (card.name, set(card.tests) - modules)


def test_no_two_methods_share_a_title_a_paper_row_a_colour_or_a_marker():
    cards = list(all_cards().values())
    for field in ("title", "color", "marker"):
        values = [getattr(card, field) for card in cards]
        assert len(set(values)) == len(values), field
    rows = [card.paper_row for card in cards if card.paper_row]
    assert len(set(rows)) == len(rows) and len(rows) == len(cards) - 1  # fine-tuning is not a paper row


def test_the_official_options_are_options_of_the_methods_config():
    import dataclasses

    from strategies.contract import config_class
    from strategies.registry import get_strategy

    with_official = {name: card for name, card in all_cards().items() if card.official_options}
    assert set(with_official) == {"moe4cl", "clap"}  # docs/decisions.md D4
    for name, card in with_official.items():
        fields = {f.name: f.default for f in dataclasses.fields(config_class(get_strategy(name)))}
        assert card.official_source
        for option, value in card.official_options.items():
            assert option in fields and fields[option] != value  # off by default, on as published


def test_reading_the_cards_imports_no_method_and_nothing_heavy():
    code = (
        "import sys; from strategies.cards import cards; cards(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'open_clip', 'avalanche'} or m.startswith('strategies.methods')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize(
    "text, says",
    [
        ('title = "X"\n', "missing fields ['lora', 'recipe', 'style', 'tests']"),
        (
            'title = "X"\nrecipe = "r"\ntests = ["t"]\nlora = false\nstyle = {color = "#000", marker = "o"}\n'
            "colour = 1\n",
            "unknown or missing fields ['colour']",
        ),
        (
            'title = "X"\nrecipe = "r"\ntests = ["t"]\nlora = "yes"\n'
            'style = {color = "#000", marker = "o"}\n',
            "lora is true or false",
        ),
        (
            'title = "X"\nrecipe = "r"\ntests = ["t"]\nlora = false\nstyle = {color = "#000", marker = "o"}\n'
            "[official]\noptions = {a = 1}\n",
            "[official] options need their source",
        ),
    ],
)
def test_a_card_with_a_wrong_field_names_its_file_and_the_field(text, says, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        read_card(path)
    assert str(error.value).startswith(str(path)) and says in str(error.value)


def test_a_card_reads_whole():
    card = all_cards()["moe4cl"]
    assert (card.title, card.paper_row, card.lora, card.tests) == ("MOE4CL", "MOE4CL", True, ("test_moe4cl",))
    assert card.official_options == {"eval_gate_noise": True}
    assert card.official_source.startswith("JiazuoYu/MoE-Adapters4CL@4572d97")
    assert (all_cards()["finetune"].paper_row, all_cards()["clap"].lora) == (None, False)
