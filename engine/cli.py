"""The engine's command line: generate, make-demo-checkpoint, bench.

Each sub-command returns (data, text); `main` prints the text, or the data as one line of JSON with `--json`.
Bad input of any kind ends as one line `error: ...` on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from contracts.errors import ContractError
from contracts.telemetry import DEFAULT_CHANNEL
from engine.errors import EngineError
from solvers.errors import SolverError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,3, got {text!r}") from None
    return ids


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _host_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    bad = [name for name in names if not name or "/" in name or " " in name]
    if bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated host names like engine.lan,10.0.0.5 (no scheme "
                                         f"or path), got {text!r}")
    return names


def _checkpoint(text: str) -> Path:
    folder = Path(text)
    if not folder.is_dir():
        raise EngineError(f"checkpoint folder {folder} does not exist" if not folder.exists()
                          else f"checkpoint {folder} is not a folder")
    return folder


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="HuggingFace-layout checkpoint folder")
    parser.add_argument("--rig", default="cpu-single", help="built-in rig name or rig file (one rank)")
    parser.add_argument("--memory", help="the rank's memory budget (e.g. 512MiB); default: the rig's")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    parser.add_argument("--json", action="store_true", help="print one line of JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="Seam's inference engine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="generate tokens for one prompt")
    _add_engine_flags(gen)
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=_token_ids, metavar="1,2,3", help="prompt token ids")
    prompt.add_argument("--prompt", metavar="TEXT", help="prompt text (needs the checkpoint's tokenizer.json)")
    gen.add_argument("--max-tokens", type=_positive, default=8)
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding (the default)")
    mode.add_argument("--temperature", type=float, help="sample at this temperature (0 means greedy)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="0 disables the top-k cut")
    gen.add_argument("--seed", type=int, help="per-request sampling seed")
    gen.add_argument("--stop-token-ids", type=_token_ids, default=[], metavar="5,6")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at the checkpoint's eos token")
    gen.set_defaults(handler=_generate)

    demo = commands.add_parser("make-demo-checkpoint", help="write the demo model (random weights, own tokenizer)")
    demo.add_argument("folder", metavar="DIR")
    demo.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    demo.add_argument("--force", action="store_true", help="write into a folder that is not empty")
    demo.add_argument("--json", action="store_true", help="print one line of JSON")
    demo.set_defaults(handler=_make_demo)

    bench = commands.add_parser("bench", help="prefill/decode tok/s and peak memory, beside transformers")
    _add_engine_flags(bench)
    bench.add_argument("--batch", type=_positive, default=1)
    bench.add_argument("--prompt-len", type=_positive, default=64)
    bench.add_argument("--gen-len", type=_positive, default=32)
    bench.add_argument("--seed", type=int, default=0, help="seed of the random prompt ids")
    bench.add_argument("--repeat", type=_positive, default=1, help="timed runs per side; the best is kept")
    bench.add_argument("--threads", type=_positive, help="torch threads on both sides (default: torch's)")
    bench.set_defaults(handler=_bench)

    serve = commands.add_parser(
        "serve", help="the multi-rank engine with its HTTP service and telemetry",
        description="Secrets come from the environment, never from argv (which `ps` shows): SEAM_ENGINE_TOKEN opens "
                    "the control API, SEAM_APPROVAL_KEY checks the console's attestation on apply, SEAM_API_KEY "
                    "(optional) guards /v1; SEAM_MAX_BODY_BYTES caps a request body (default 8 MiB).")
    serve.add_argument("--checkpoint", required=True, metavar="DIR", help="HuggingFace-layout checkpoint folder")
    serve.add_argument("--rig", default="cpu-demo", help="built-in rig name or rig file (default cpu-demo)")
    serve.add_argument("--cut", help="layers per rank, e.g. 7,5,4 (default: the rig's incumbent)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; one other than loopback needs "
                                                             "$SEAM_API_KEY or --allow-open-v1")
    serve.add_argument("--allow-open-v1", action="store_true",
                       help="serve /v1 without an API key on a non-loopback --host, on purpose")
    serve.add_argument("--allowed-hosts", type=_host_names, default=(), metavar="NAME,...",
                       help="more Host names /v1 answers to, beside localhost, 127.0.0.1, [::1] and a non-wildcard "
                            "--host ('*': any); others get 421, against DNS rebinding")
    serve.add_argument("--port", type=_positive, default=8100)
    serve.add_argument("--deterministic", action="store_true",
                       help="one sequence a step: greedy tokens never depend on what else is served, at batch 1's "
                            "throughput")
    serve.add_argument("--redis-url", help="publish telemetry here (default: $REDIS_URL; none: no publishing)")
    serve.add_argument("--telemetry-hz", type=float, default=4.0)
    serve.add_argument("--telemetry-channel", default=DEFAULT_CHANNEL, help="Redis pub/sub channel")
    serve.add_argument("--ladder", help="arm a layout ladder: rungs as cuts separated by ';', e.g. '7,5,4;8,4,4' "
                                        "(the serving cut must be one of them)")
    serve.add_argument("--state-dir", type=Path, metavar="DIR",
                       help="where the engine keeps what must survive a restart (the spent-job ledger); default "
                            "$SEAM_ENGINE_STATE_DIR/port-<port>, else ~/.local/state/seam/engine-port-<port>")
    serve.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(handler=_serve)
    return parser


def _generate(args: argparse.Namespace) -> tuple[dict, str]:
    from engine.llm import LLM
    from engine.runtime.sampler import SamplingParams

    folder = _checkpoint(args.checkpoint)
    if args.prompt is not None and not (folder / "tokenizer.json").is_file():
        raise EngineError(f"checkpoint {folder} has no tokenizer.json, so --prompt cannot be encoded: "
                          "pass --prompt-ids instead")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature or 0.0, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, stop_token_ids=tuple(args.stop_token_ids),
                            ignore_eos=args.ignore_eos)
    llm = LLM(folder, rig=args.rig, memory=args.memory, device=args.device)
    done = llm.generate([args.prompt if args.prompt is not None else args.prompt_ids], params)[0]
    data = {"token_ids": done.token_ids, "finish_reason": done.finish_reason, "prompt_ids": done.prompt_ids}
    if llm.tokenizer is not None:
        data["text"] = done.text
    text = f"token_ids: {' '.join(map(str, done.token_ids))}\nfinish_reason: {done.finish_reason}"
    return data, text + (f"\ntext: {done.text}" if done.text is not None else "")


def _make_demo(args: argparse.Namespace) -> tuple[dict, str]:
    from engine.demo import make_demo_checkpoint

    summary = make_demo_checkpoint(args.folder, seed=args.seed, force=args.force)
    text = (f"wrote {summary['model']} to {summary['checkpoint']}: {summary['parameters']:,} parameters "
            f"({summary['bytes'] / 2**20:.1f} MiB), tokenizer of {summary['vocab_size']} tokens")
    return summary, text


def _bench(args: argparse.Namespace) -> tuple[dict, str]:
    from engine.bench import format_text, run_bench

    result = run_bench(_checkpoint(args.checkpoint), batch=args.batch, prompt_len=args.prompt_len,
                       gen_len=args.gen_len, device=args.device, rig=args.rig, memory=args.memory, seed=args.seed,
                       repeat=args.repeat, threads=args.threads)
    return result, format_text(result)


def _serve(args: argparse.Namespace) -> tuple[dict, str]:
    from engine.serve.main import default_redis_url, run_service

    run_service(_checkpoint(args.checkpoint), args.rig, args.cut, args.host, args.port,
                args.redis_url or default_redis_url(), args.telemetry_hz, args.telemetry_channel, args.ladder,
                args.allow_open_v1, args.state_dir, args.allowed_hosts, args.deterministic)
    return {"stopped": True}, "seam engine stopped"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data, text = args.handler(args)
    except (EngineError, ContractError, SolverError, OSError) as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(data) if args.json else text)
    except BrokenPipeError:  # the reader (e.g. `| head`) went away; nothing left to say
        sys.stderr.close()
    return 0


def _one_line(error: BaseException) -> str:
    """Errors that list several problems (a checkpoint's tensors) keep them, joined on one line."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
