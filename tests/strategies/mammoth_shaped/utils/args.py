"""Argument groups as Mammoth's main builds its parser (names and defaults of the options the
adapter relies on; written for the tests)."""

from argparse import ArgumentParser


def add_experiment_args(parser: ArgumentParser) -> None:
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch_size", type=int)
    parser.add_argument("--n_epochs", type=int)
    parser.add_argument("--label_perc", type=float, default=1)
    parser.add_argument("--optimizer", type=str, default="sgd", choices=["sgd", "adam", "adamw"])
    parser.add_argument("--optim_wd", type=float, default=0.0)
    parser.add_argument("--optim_mom", type=float, default=0.0)
    parser.add_argument("--drop_last", type=int, default=0)
    parser.add_argument("--lr_scheduler", type=str)
    parser.add_argument("--scheduler_mode", type=str, default="epoch", choices=["epoch", "iter"])


def add_management_args(parser: ArgumentParser) -> None:
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", type=str)
    parser.add_argument("--num_workers", type=int)
    parser.add_argument("--non_verbose", type=int, default=0)
    parser.add_argument("--debug_mode", type=int, default=0)


def add_rehearsal_args(parser: ArgumentParser) -> None:
    parser.add_argument("--buffer_size", type=int, required=True)
    parser.add_argument("--minibatch_size", type=int)


def fix_model_parser_backwards_compatibility(main_parser, model_parser):
    known = {action.dest for action in main_parser._actions}
    for action in model_parser._actions:
        if action.dest != "help" and action.dest not in known:
            main_parser._add_action(action)
    return main_parser
