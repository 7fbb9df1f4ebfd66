"""The shared prompt module (strategies/prompting.py) and L2P++: selection against an independent
top-k, the key losses against loops, prefix assembly, the parameter count of docs/baselines.md §9,
and a run: frozen backbone, past head rows unchanged, accuracy above chance, exact save/load and
resume. The CODA cosine is in ``test_optim.py``."""

import dataclasses
import math

import pytest
import torch

from strategies.methods.l2p_pp import L2PPlusPlus
from strategies.prompting import cosine_matrix, key_loss, prefix_from_prompts, select_prompts
from strategies.settings import RunSettings
from tests.helpers import (
    check_save_load_and_resume,
    run_one_run_suite,
    strategy_and_stream,
    strategy_from_suite,
    three_task_suite,
)

# docs/baselines.md §9's smallest test: block 0, pool 6, length 4, top-2.
SUITE = three_task_suite(
    "l2p_pp",
    "epochs = 3\nbatch_size = 20\neval_batch_size = 100\nlr = 0.01\n"
    "pool_size = 6\nprompt_length = 4\ntop_k = 2",
    augmentation="rrc_flip",
)


def test_selection_is_an_independent_top_k_of_the_cosines():
    generator = torch.Generator().manual_seed(0)
    query, keys = torch.randn(5, 8, generator=generator), torch.rand(6, 8, generator=generator)
    cosines = cosine_matrix(query, keys)
    for b in range(5):
        for m in range(6):
            expected = float(query[b] @ keys[m] / (query[b].norm() * keys[m].norm()))
            assert math.isclose(float(cosines[b, m]), expected, abs_tol=1e-6)
    selected = select_prompts(cosines, 3)
    for b in range(5):
        ranked = sorted(range(6), key=lambda m: -float(cosines[b, m]))
        assert selected[b].tolist() == ranked[:3]


def test_key_losses_equal_loops():
    generator = torch.Generator().manual_seed(1)
    cosines = torch.rand(4, 6, generator=generator) * 2 - 1
    selected = select_prompts(cosines, 2)
    own = sum(1 - float(cosines[b, j]) for b in range(4) for j in selected[b].tolist())
    every = sum(1 - float(cosines[b, j]) for b in range(4) for c in range(4) for j in selected[c].tolist())
    assert math.isclose(float(key_loss(cosines, selected, "own_topk")), own, abs_tol=1e-5)
    assert math.isclose(float(key_loss(cosines, selected, "all_pairs")), every, abs_tol=1e-5)


def test_a_prompts_first_half_joins_the_keys_and_its_second_half_the_values():
    prompts = torch.arange(2 * 2 * 4 * 3, dtype=torch.float32).view(2, 2, 4, 3)  # [B, k, L, D]
    keys, values = prefix_from_prompts(prompts)
    assert keys.shape == values.shape == (2, 4, 3)
    assert torch.equal(keys[1], torch.cat([prompts[1, 0, :2], prompts[1, 1, :2]]))
    assert torch.equal(values[1], torch.cat([prompts[1, 0, 2:], prompts[1, 1, 2:]]))


def test_trainable_parameters_match_baselines_md(vit_b16):
    torch.manual_seed(0)
    vit = L2PPlusPlus(
        backbone=vit_b16,
        class_names=[str(c) for c in range(100)],
        config=L2PPlusPlus.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert vit.trainable_parameter_count() == 527_460  # 460,800 prompts + 15,360 keys + 51,300 head
    assert not any(p.requires_grad for p in vit.backbone.parameters())


@pytest.fixture(scope="module")
def l2p_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("l2p"), SUITE, "--save-models")


@pytest.mark.slow
def test_a_run_learns_with_the_backbone_frozen(l2p_run):
    suite, results, result = l2p_run
    assert result["summary"]["last_acc"] > 100 / 15 * 2  # well above chance over 15 classes
    assert result["config"]["strategy_config"]["schedule"] == "coda_cosine"
    strategy, _, _ = strategy_from_suite(suite)
    trained, _, _ = strategy_from_suite(suite)
    trained.load_model(results / "synthetic" / "l2p_pp" / "T3-seed0.model")
    frozen = {k: v for k, v in strategy.backbone.state_dict().items()}
    assert all(torch.equal(frozen[k], v) for k, v in trained.backbone.state_dict().items())
    assert not torch.equal(strategy.pool.prompts, trained.pool.prompts)


def test_past_head_rows_do_not_change_and_selection_is_per_image(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, SUITE)
    strategy.cfg.epochs = 1
    strategy.learn(stream.train_stream[0])
    first = [c for c in strategy.seen_classes]
    rows = strategy.head.weight[first].detach().clone(), strategy.head.bias[first].detach().clone()
    strategy.learn(stream.train_stream[1])
    assert torch.equal(strategy.head.weight[first], rows[0]) and torch.equal(
        strategy.head.bias[first], rows[1]
    )
    images = torch.stack([stream.test_set[i][0] for i in range(6)])
    with torch.no_grad():
        strategy.scores(images)
        query = strategy.query(images)
    expected = cosine_matrix(query, strategy.pool.keys).topk(2, dim=1).indices
    assert torch.equal(strategy.last_selection, expected)


@pytest.mark.slow
def test_save_load_and_resume_are_exact(l2p_run, tmp_path, monkeypatch):
    check_save_load_and_resume(l2p_run, L2PPlusPlus, tmp_path, monkeypatch)


# ---------------------------------------------------------------- DualPrompt
# docs/baselines.md §10's smallest test: G at {0, 1}, E at {2, 3} (the tiny model has 4 blocks), 3 tasks.
DUAL = three_task_suite(
    "dualprompt",
    "epochs = 3\nbatch_size = 20\neval_batch_size = 100\nlr = 0.01\n"
    "g_layers = [0, 1]\ne_layers = [2, 3]\npool_size = 3\ng_length = 4\ne_length = 4",
    augmentation="rrc_flip",
)


def test_dualprompt_trainable_parameters_match_baselines_md(vit_b16):
    from strategies.methods.dualprompt import DualPrompt

    torch.manual_seed(0)
    vit = DualPrompt(
        backbone=vit_b16,
        class_names=[str(c) for c in range(100)],
        config=DualPrompt.Config(),
        settings=RunSettings(show_progress=False),
    )
    # G 9,216 + E 460,800 + keys 15,360 (one set per E layer, the default) + head 51,300
    assert vit.trainable_parameter_count() == 536_676


def test_dualprompt_trains_only_the_tasks_own_prompt_and_key(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, DUAL)
    strategy.cfg.epochs = 1

    def state():  # E-prompts [pool, ...] and keys [pool, n sets, d]: the task on the first axis
        return strategy.prompts.e.detach().clone(), strategy.key_sets().detach().transpose(0, 1).clone()

    before = state()
    assert before[1].shape[1] == 2  # one key set per E layer (the official layout, the default)
    strategy.learn(stream.train_stream[0])
    after_first = state()
    assert not torch.equal(after_first[0][0], before[0][0]) and not torch.equal(
        after_first[1][0], before[1][0]
    )
    assert torch.equal(after_first[0][1:], before[0][1:]) and torch.equal(after_first[1][1:], before[1][1:])
    strategy.learn(stream.train_stream[1])
    assert torch.equal(strategy.prompts.e[0], after_first[0][0])  # task 1's prompt and key are done
    assert torch.equal(state()[1][0], after_first[1][0])
    assert not torch.equal(strategy.prompts.e[1], before[0][1]) and torch.equal(
        strategy.prompts.e[2], before[0][2]
    )


def test_dualprompt_selects_the_task_whose_key_is_nearest_among_the_seen_tasks(tmp_path):
    path = tmp_path / "dual.toml"
    path.write_text(DUAL.replace("pool_size = 3", 'pool_size = 3\nkeys = "shared"\nselect_over = "seen"'))
    strategy, _, _ = strategy_from_suite(path)
    d = strategy.backbone.embed_dim
    directions = torch.eye(d)[:3] * 5.0
    with torch.no_grad():
        strategy.prompts.keys.copy_(directions)  # keys = the per-task mean queries
    generator = torch.Generator().manual_seed(4)
    truth = torch.arange(3).repeat_interleave(10)
    queries = directions[truth] + 0.5 * torch.randn(30, d, generator=generator)
    strategy.task_classes = [[0], [1], [2]]
    assert torch.equal(strategy.select(queries)[:, 0], truth)  # 100 % on a separable world
    strategy.task_classes = [[0], [1]]  # task 3 not seen yet: never picked
    assert set(strategy.select(queries)[:, 0].tolist()) <= {0, 1}
    strategy.cfg.select_over = "pool"
    assert torch.equal(strategy.select(queries)[:, 0], truth)  # the official quirk: over the whole pool


def test_dualprompt_each_e_layer_selects_with_its_own_keys_over_the_whole_pool(tmp_path):
    """The default, as the CODA-Prompt code: layer i's E-prompt is the argmax over all pool_size of
    its own keys, untrained ones included, whatever task has been seen."""
    path = tmp_path / "dual.toml"
    path.write_text(DUAL)
    strategy, _, _ = strategy_from_suite(path)
    d = strategy.backbone.embed_dim
    directions = torch.eye(d)[:3] * 5.0
    with torch.no_grad():  # layer 0's keys point at tasks 0, 1, 2; layer 1's at 2, 0, 1
        strategy.prompts.keys.copy_(torch.stack([directions, directions[[2, 0, 1]]]))
    truth = torch.arange(3).repeat_interleave(4)
    queries = directions[truth] + 0.1 * torch.randn(12, d, generator=torch.Generator().manual_seed(4))
    strategy.task_classes = [[0]]  # one task seen: the pool's other keys still compete
    chosen = strategy.select(queries)
    assert torch.equal(chosen[:, 0], truth) and torch.equal(chosen[:, 1], (truth + 1) % 3)
    prefixes, _ = strategy.prefixes(queries, train=False)
    e_keys = prefixes[3][0]  # block 3 is E layer 1 (blocks 2, 3): its own choice
    assert torch.equal(e_keys, strategy.prompts.e[(truth + 1) % 3, 1, :2])


def test_dualprompt_puts_e_before_g_where_both_apply(tmp_path):
    path = tmp_path / "dual.toml"
    path.write_text(DUAL.replace("e_layers = [2, 3]", "e_layers = [1, 2]"))
    strategy, _, _ = strategy_from_suite(path)
    strategy.task_classes = [[0]]
    query = torch.randn(2, strategy.backbone.embed_dim)
    prefixes, _ = strategy.prefixes(query, train=False)
    keys, values = prefixes[1]
    chosen = strategy.select(query)[:, 0]  # E layer 0's pick for each image
    g_prompt = strategy.prompts.g[1]
    for b in range(2):
        e_prompt = strategy.prompts.e[chosen[b], 0]
        assert torch.equal(keys[b], torch.cat([e_prompt[:2], g_prompt[:2]]))
        assert torch.equal(values[b], torch.cat([e_prompt[2:], g_prompt[2:]]))


@pytest.fixture(scope="module")
def dual_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("dual"), DUAL, "--save-models")


@pytest.mark.slow
def test_dualprompt_learns_and_saves_and_resumes_exactly(dual_run, tmp_path, monkeypatch):
    from strategies.methods.dualprompt import DualPrompt

    assert dual_run[2]["summary"]["last_acc"] > 100 / 15 * 2
    check_save_load_and_resume(dual_run, DualPrompt, tmp_path, monkeypatch)


def test_prompt_blocks_beyond_the_model_are_one_line(tmp_path):
    from benchmarks import run

    suite = tmp_path / "bad.toml"
    suite.write_text(DUAL.replace("e_layers = [2, 3]", "e_layers = [2, 3, 4]"))
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--quiet"]) == 2


# ---------------------------------------------------------------- CODA-Prompt
# docs/baselines.md §11's smallest test: 12 components, length 4, blocks {0..3}, 3 tasks.
CODA = three_task_suite(
    "coda_prompt",
    "epochs = 2\nbatch_size = 20\neval_batch_size = 100\nlr = 0.01\n"
    "components = 12\nprompt_length = 4\nprompt_layers = [0, 1, 2, 3]",
    augmentation="rrc_flip",
)


def test_gram_schmidt_gives_an_orthonormal_slice_orthogonal_to_the_old_rows():
    from strategies.methods.coda_prompt import gram_schmidt

    generator = torch.Generator().manual_seed(5)
    rows = torch.zeros(9, 20, dtype=torch.float64)
    rows[:3] = torch.randn(3, 20, generator=generator, dtype=torch.float64)  # "trained" rows: not orthonormal
    out = gram_schmidt(rows, 3, 6, generator, mode="exact")
    assert torch.equal(out[:3], rows[:3]) and torch.equal(out[6:], rows[6:])  # only the slice changes
    new = out[3:6]
    torch.testing.assert_close(new @ new.T, torch.eye(3, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(new @ out[:3].T, torch.zeros(3, 3, dtype=torch.float64), atol=1e-12, rtol=0)


def test_alpha_equals_a_loop():
    from strategies.methods.coda_prompt import component_weights

    generator = torch.Generator().manual_seed(6)
    query, keys, attention = (torch.randn(*shape, generator=generator) for shape in ((3, 5), (4, 5), (4, 5)))
    alpha = component_weights(query, keys, attention)
    for b in range(3):
        for m in range(4):
            attended = query[b] * attention[m]
            expected = float(attended @ keys[m] / (attended.norm() * keys[m].norm()))
            assert math.isclose(float(alpha[b, m]), expected, abs_tol=1e-6)


def test_coda_trainable_parameters_match_baselines_md(vit_b16):
    from strategies.methods.coda_prompt import CodaPrompt

    torch.manual_seed(0)
    vit = CodaPrompt(
        backbone=vit_b16,
        class_names=[str(c) for c in range(100)],
        config=CodaPrompt.Config(),
        settings=RunSettings(show_progress=False),
    )
    assert vit.trainable_parameter_count() == 3_635_300  # 5 x (614,400 + 102,400) + 51,300


def test_coda_slices_new_components_per_task_and_never_changes_old_ones(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, CODA)
    strategy.cfg.epochs = 1
    strategy.learn(stream.train_stream[0])
    assert strategy.per_task == 4
    parameters = [p.detach().clone() for p in strategy.components.parameters()]
    assert all(torch.count_nonzero(p[:, 4:]) == 0 for p in parameters)  # later slices wait for their task
    strategy.learn(stream.train_stream[1])
    for before, after in zip(parameters, strategy.components.parameters(), strict=True):
        assert torch.equal(after[:, :4], before[:, :4])  # task 1's slice is frozen
        assert torch.count_nonzero(after[:, 4:8]) > 0 and torch.count_nonzero(after[:, 8:]) == 0
    # The next slice, before training. Official Gram-Schmidt (the default): unit rows, not orthogonal
    # to the trained ones; exact: orthonormal and orthogonal to the rest.
    strategy.setup_task(2, stream.tasks[2])
    leak = 0.0
    for parameter in strategy.components.parameters():
        for layer in range(parameter.shape[0]):
            flat = parameter[layer].detach().reshape(12, -1).double()
            torch.testing.assert_close(flat[8:12].norm(dim=1), torch.ones(4, dtype=torch.float64))
            leak = max(leak, float((flat[8:12] @ flat[:8].T).abs().max()))
    assert leak > 1e-3
    strategy.cfg.gram_schmidt = "exact"
    strategy.setup_task(2, stream.tasks[2])
    for parameter in strategy.components.parameters():
        for layer in range(parameter.shape[0]):
            flat = parameter[layer].detach().reshape(12, -1).double()
            new, old = flat[8:12], flat[:8]
            torch.testing.assert_close(new @ new.T, torch.eye(4, dtype=torch.float64), atol=1e-5, rtol=0)
            assert (new @ old.T).abs().max() < 1e-5


def test_official_gram_schmidt_by_hand():
    """Classical Gram-Schmidt as the CODA-Prompt code computes it: the draw minus its projections on
    the earlier rows as they are, then unit length; orthogonal only to orthogonal earlier rows."""
    from strategies.methods.coda_prompt import gram_schmidt

    draw = torch.randn(3, generator=torch.Generator().manual_seed(7))  # the one draw of row 2
    skewed = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    u = draw - draw[0] * skewed[0] - (draw[0] + draw[1]) / 2 * skewed[1]
    out = gram_schmidt(skewed, 2, 3, torch.Generator().manual_seed(7))
    torch.testing.assert_close(out[2], u / u.norm())
    assert abs(float(out[2] @ skewed[0])) > 1e-3  # (v0 - v1) / 2 / |u|: not orthogonal to row 0
    straight = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    out = gram_schmidt(straight, 2, 3, torch.Generator().manual_seed(7))
    torch.testing.assert_close(out[2], torch.tensor([0.0, 0.0, float(draw[2].sign())]))


def test_coda_draws_depend_on_the_run_seed_and_task_not_on_the_global_generator(tmp_path):
    strategy, stream = strategy_and_stream(tmp_path, CODA)
    slices = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        strategy.setup_task(0, stream.tasks[0])
        slices.append(strategy.components.prompts.detach().clone())
    assert torch.equal(*slices) and torch.count_nonzero(slices[0]) > 0
    strategy.settings = dataclasses.replace(strategy.settings, seed=strategy.settings.seed + 1)
    strategy.setup_task(0, stream.tasks[0])
    assert not torch.equal(strategy.components.prompts, slices[0])


@pytest.fixture(scope="module")
def coda_run(tmp_path_factory):
    return run_one_run_suite(tmp_path_factory.mktemp("coda"), CODA, "--save-models")


@pytest.mark.slow
def test_coda_learns_repeats_and_resumes_exactly(coda_run, tmp_path, monkeypatch):
    from benchmarks import run
    from benchmarks.runner.reading import iter_results
    from strategies.methods.coda_prompt import CodaPrompt

    suite, results, reference = coda_run
    assert reference["summary"]["last_acc"] > 100 / 15 * 2
    again = tmp_path / "again"
    assert run.main(["--suite", str(suite), "--results-dir", str(again), "--quiet"]) == 0
    (repeat,) = [r for _, r in iter_results(again)]
    assert repeat["stages"] == reference["stages"]  # two CPU runs with the same seed
    assert check_save_load_and_resume(coda_run, CodaPrompt, tmp_path, monkeypatch).per_task == 4
