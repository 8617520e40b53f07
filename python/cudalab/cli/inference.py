"""The ``inference`` command: the guide's model inference comparison, as lesson ``inference``.

``cudalab inference --model resnet50 --batch-sizes 1,8,16,32 [--dtype fp16]
[--graph] [--json PATH]`` runs ResNet-50 on the CPU (the NumPy reference,
torch when installed) and on the GPU for each batch size, in the precisions
``--dtype`` names (default fp32, as the guide's script; a comma list for
several), eagerly and, with ``--graph``, replayed from a CUDA graph, with
torchvision's model beside it when torch and torchvision are installed. The
CPU runs at the smallest batch size only unless ``--cpu-batch-sizes`` says
otherwise. Output, ``--json`` and ``--markdown`` are those of ``cudalab
lesson inference``. ``--model-name`` is the same option as ``--model``, under
the name the guide's model_inference_comparison.py gives it, so the guide's
command line (``--model-name resnet50 --batch-sizes 1,8,16,32``) works as written.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from ..lessons import resnet as R
from .args import common_parser
from .lessons import run_lessons, running_parser

__all__ = ["add_parsers", "lesson_params"]

MODELS = ("resnet50",)


def _argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser raising ValueError."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def lesson_params(args: argparse.Namespace) -> dict[str, Any]:
    """lesson_params(args) -> dict

    The inference lesson's parameters from the command's arguments: the
    batch sizes, the precisions (``--dtype``), ``graph`` from ``--graph``,
    and the CPU batch sizes (default: the smallest batch size).
    """
    batches = args.batch_sizes
    cpu = args.cpu_batch_sizes if args.cpu_batch_sizes is not None else (min(batches),)
    return {"batch_sizes": batches, "precisions": args.dtype, "graph": bool(args.graph),
            "cpu_batch_sizes": cpu}


def _cmd_inference(args: argparse.Namespace) -> int:
    return run_lessons(args, "inference", [("inference", lesson_params(args))])


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``inference`` to the CLI."""
    parser = sub.add_parser(
        "inference", parents=[common_parser(), running_parser()],
        help="the guide's model inference comparison: CPU vs GPU per batch size (lesson "
             "inference)",
        description="Run ResNet-50 inference on the CPU and the GPU per batch size and "
                    "precision (lesson inference), beside torchvision's resnet50 with the "
                    "same weights when torch and torchvision are installed.")
    # --model-name: the guide's spelling (model_inference_comparison.py --model-name resnet50)
    parser.add_argument("--model", "--model-name", dest="model", choices=MODELS,
                        default="resnet50",
                        help="the network (default resnet50); --model-name is the same option, "
                             "as the guide spells it")
    parser.add_argument("--batch-sizes", type=_argtype(R.parse_batch_sizes), metavar="N,N,...",
                        default=(1, 8, 16, 32),
                        help=f"batch sizes, each 1..{R.MAX_BATCH} (default 1,8,16,32, as "
                             "the guide)")
    parser.add_argument("--dtype", type=_argtype(R.parse_precisions), metavar="P[,P...]",
                        default=("fp32",),
                        help=f"precisions among {', '.join(R.PRECISIONS)} (float16, bfloat16 "
                             "also accepted); default fp32")
    parser.add_argument("--graph", action="store_true",
                        help="also replay each forward from a CUDA graph")
    parser.add_argument("--cpu-batch-sizes", type=_argtype(R.parse_batch_sizes),
                        metavar="N,N,...", default=None,
                        help="batch sizes run on the CPU (default: the smallest batch size)")
    parser.set_defaults(func=_cmd_inference)
