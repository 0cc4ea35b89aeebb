"""`soakmatrix sim-engine`: the simulated vLLM server (takes `vllm serve` flags)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from soakmatrix.matrix.contracts.outcomes import EXIT_USAGE

HELP = """The simulated vLLM server: `soakmatrix sim-engine MODEL [vllm serve flags...] --host H --port P
[--hang-model FILE] [--gpu-type T] [--time-scale S] [--seed N] [--hang-record FILE]`.
It takes the `vllm serve` flags the flag registry emits, serves vLLM's OpenAI API, /health and
/metrics, logs like vLLM, and hangs as the hang-model file says (docs/guide/sim-engine.md)."""

USAGE = (
    "soakmatrix sim-engine MODEL [vllm serve flags...] [--host HOST] [--port PORT] [--hang-model FILE]\n"
    "                      [--gpu-type TYPE] [--time-scale S] [--seed N] [--hang-record FILE]"
)

OPTIONS = """
our options:
  --hang-model FILE    the hang-model file (docs/reference/hang-model.md); none: the engine never hangs
  --gpu-type TYPE      the GPU type hangs match against (default: $SOAKMATRIX_GPU_TYPE)
  --time-scale S       divide the hang clocks (MTTF, VLLM_RINGBUFFER_WARNING_INTERVAL,
                       VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS) and VLLM_LOG_STATS_INTERVAL (floor 0.5 s) by S
  --seed N             seeds the output tokens, step-time jitter and the hangs' times (with the model's seed)
  --hang-record FILE   append one JSON line per hang at the moment it begins
  --step-time-scale F  multiply the simulated GPU step times (default 1; 0 = no GPU time, for benchmarks)
  --torch-device DEV   run each step with torch on a real device (cuda, cuda:N, or cpu); planted hangs then
                       stall in real CUDA and gloo calls (jobs/sim/torch_device.py, docs/guide/gpu-nodes.md)

vLLM flags read: --model, --host, --port, --served-model-name, --max-model-len, --num-gpu-blocks-override,
  --disable-log-stats, --disable-uvicorn-access-log, and every flag of the flag registry
  (matrix/contracts/flags.py); other vLLM flags are ignored with a note in the log.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    # vLLM's flags are many and mostly unmodelled: args.py parses the whole argv itself, so the
    # dispatcher's parser only hands it over (and answers -h).
    parser.usage = USAGE
    parser.epilog = OPTIONS
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="the model and `vllm serve` flags")

    def parse_args(args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        args = list(sys.argv[1:] if args is None else args)
        if any(a in ("-h", "--help") for a in args):
            parser.print_help()
            parser.exit(0)
        return argparse.Namespace(argv=args)

    parser.parse_args = parse_args  # type: ignore[method-assign, assignment]  # the dispatcher's parser, patched


def main(args: argparse.Namespace) -> int:
    from .args import SimUsageError, parse_sim_argv

    try:
        config = parse_sim_argv(args.argv)
    except SimUsageError as exc:
        print(f"usage: {USAGE}", file=sys.stderr)
        print(f"soakmatrix sim-engine: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if config.hang_model:
        from soakmatrix.matrix.contracts.hangmodel import load_hang_model
        from soakmatrix.matrix.contracts.yamlsrc import SpecError

        try:
            load_hang_model(config.hang_model)
        except (SpecError, OSError) as exc:
            print(f"soakmatrix sim-engine: hang model: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from .server import serve

    return serve(config)


def run(argv: Sequence[str]) -> int:
    """`soakmatrix sim-engine ARGV...` in this process (tests, benchmarks)."""
    parser = argparse.ArgumentParser(prog="soakmatrix sim-engine", description=HELP)
    configure(parser)
    return main(parser.parse_args(list(argv)))
